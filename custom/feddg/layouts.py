"""The on-disk data layouts, each declared once: its name, task, files, mask encoding, scanner and decoder.

Everything else is derived from :data:`LAYOUTS`: the values ``data.layout`` may take in ``feddg.yaml`` and the
layout -> task check (:mod:`feddg.config`), the ``--layout`` choices of the ``feddg`` commands, the data check, the
loader (:mod:`feddg.data.layouts`) and the documentation's table of layouts (:func:`layouts_table`). A new layout is
one more :class:`Layout` here, plus its scanner and decoder in :mod:`feddg.data.layouts` when the existing ones do
not fit.

Why this module sits in the base layer (``tests/test_layers.py``): the experiment schema and the CLI read it, and
both must load without numpy, PIL, nibabel or torch (``feddg --help`` starts in well under a second). So this module
holds data only and imports nothing but the standard library; a layout names its scanner and decoder by dotted path
(``"module:function"``), which :func:`feddg.data.layouts.registry.implementation` imports on first use, in the data
layer. The paths are checked against the code by ``tests/data/test_layout_declaration.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

SPLIT_FOLDERS = ("train", "test")  # the split folders of a layout with ``split_folders``, in this order

Intensity = Literal["zscore", "unit_range"]
_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One on-disk layout of a site's data folder ``<root>/<SITE>/...``.

    Attributes:
        name: the value of ``data.layout`` and of ``--layout``.
        task: the task whose labels the masks encode (a key of :data:`feddg.config.TASKS`).
        description: one line, for the documentation and the command help.
        split_folders: True: the files lie in ``<SITE>/train/`` and ``<SITE>/test/`` (:data:`SPLIT_FOLDERS`);
            False: directly under ``<SITE>/``, without a split.
        image_folder: the folders below ``<SITE>/`` (or ``<SITE>/<split>/``) that hold the images; () for none.
        mask_folder: the same for the masks.
        image_name: an image's file name without its suffix, in words (``"<case>_<slice>"``).
        mask_name: a mask's file name without its suffix, in words; images and masks are paired by name only.
        suffixes: the file name endings of the layout's images and masks, lower case, the usual one first.
        channels: image channels after decoding.
        volumes: True: a file is a 3D volume with a known voxel spacing (distances in mm); False: one 2D image.
        intensity: ``"zscore"`` (MRI, arbitrary units: zero mean, unit variance) or ``"unit_range"`` (8-bit colour
            photographs, 0..255 -> [-1, 1]).
        square_crop: centre-crop to a square before resizing (fundus: the papers crop the disc region).
        mask_values: the values a mask may hold; None: any non-negative integer.
        encoding: the mask encoding in words, for error messages.
        scanner: ``"module:function"``, the function ``(layout, site_dir, site) -> (records, problems)`` that finds a
            site's image/mask pairs without reading pixels.
        decoder: ``"module:function"``, the function ``(record, layout) -> Decoded`` that reads and validates one
            pair at its stored resolution.
    """

    name: str
    task: str
    description: str
    split_folders: bool
    image_folder: tuple[str, ...]
    mask_folder: tuple[str, ...]
    image_name: str
    mask_name: str
    suffixes: tuple[str, ...]
    channels: int
    volumes: bool
    intensity: Intensity
    square_crop: bool
    mask_values: frozenset[int] | None
    encoding: str
    scanner: str
    decoder: str

    def __post_init__(self) -> None:
        for field_name in ("scanner", "decoder"):
            value = getattr(self, field_name)
            if not _DOTTED.match(value):
                raise ValueError(f"layout {self.name!r}: {field_name} {value!r} is not a 'module:function' path")
        if self.intensity not in get_args(Intensity):
            raise ValueError(f"layout {self.name!r}: intensity {self.intensity!r} is not one of {get_args(Intensity)}")
        if not self.suffixes or any(s != s.lower() or not s.startswith(".") for s in self.suffixes):
            raise ValueError(f"layout {self.name!r}: suffixes {self.suffixes!r} must be lower-case '.ext' endings")

    def _files(self, folder: tuple[str, ...], name: str) -> str:
        split = ("{" + ",".join(SPLIT_FOLDERS) + "}",) if self.split_folders else ()
        return "/".join(("<SITE>", *split, *folder, name + self.suffixes[0]))

    @property
    def image_files(self) -> str:
        """Where an image lies under the data root, e.g. ``<SITE>/{train,test}/image/<case>_<slice>.png``."""
        return self._files(self.image_folder, self.image_name)

    @property
    def mask_files(self) -> str:
        """Where a mask lies under the data root, e.g. ``<SITE>/{train,test}/mask/<case>_<slice>.png``."""
        return self._files(self.mask_folder, self.mask_name)


# What the two PNG layouts share: one file per slice, in train/ and test/ folders.
_PNG_SLICES = {"split_folders": True, "suffixes": (".png",), "volumes": False}

_DECLARED = (
    Layout(
        name="saml_nifti",
        task="prostate",
        description="SAML multi-site prostate MRI: one NIfTI volume per case (.nii.gz or .nii), its mask beside it "
                    "(CaseNN_segmentation; BMC spells it _Segmentation, both are accepted at every site)",
        split_folders=False,
        image_folder=(),
        mask_folder=(),
        image_name="<case>",
        mask_name="<case>_segmentation",
        suffixes=(".nii.gz", ".nii"),
        channels=1,
        volumes=True,
        intensity="zscore",
        square_crop=False,
        mask_values=None,
        encoding="non-negative integer labels, any non-zero label = prostate",
        scanner="feddg.data.layouts.saml_nifti:scan",
        decoder="feddg.data.layouts.saml_nifti:decode",
    ),
    Layout(
        name="slice_png",
        **_PNG_SLICES,
        task="prostate",
        description="prostate MRI slices as 8-bit grayscale PNGs, one file per slice; the mask is inverted "
                    "(prostate = 0, background = 255)",
        image_folder=("image",),
        mask_folder=("mask",),
        image_name="<case>_<slice>",
        mask_name="<case>_<slice>",
        channels=1,
        intensity="zscore",
        square_crop=False,
        mask_values=frozenset({0, 255}),
        encoding="0 = prostate, 255 = background",
        scanner="feddg.data.layouts.slice_png:scan",
        decoder="feddg.data.layouts.slice_png:decode",
    ),
    Layout(
        name="dofe_png",
        **_PNG_SLICES,
        task="fundus",
        description="DoFE fundus regions of interest: RGB PNG images; 3-channel PNG masks with cup = 0, rim = 128, "
                    "background = 255 (disc = rim and cup)",
        image_folder=("ROIs", "image"),
        mask_folder=("ROIs", "mask"),
        image_name="<name>",
        mask_name="<name>",
        channels=3,
        intensity="unit_range",
        square_crop=True,
        mask_values=frozenset({0, 128, 255}),
        encoding="0 = cup, 128 = rim, 255 = background",
        scanner="feddg.data.layouts.dofe_png:scan",
        decoder="feddg.data.layouts.dofe_png:decode",
    ),
)


def by_name(declared: tuple[Layout, ...]) -> Mapping[str, Layout]:
    """``declared`` by name, in order, read-only; ValueError naming any name declared twice."""
    names = [layout.name for layout in declared]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"data layouts declared twice: {repeated}")
    return MappingProxyType({layout.name: layout for layout in declared})


LAYOUTS: Mapping[str, Layout] = by_name(_DECLARED)
"""Every layout by name, in declaration order (read-only)."""


def layouts_for(task: str) -> list[str]:
    """The names of the layouts whose masks encode ``task``'s labels, in declaration order."""
    return [name for name, layout in LAYOUTS.items() if layout.task == task]


def files_help() -> str:
    """Each layout's image and mask files, in one line for the command help."""
    return "; ".join(f"{name}: images {layout.image_files}, masks {layout.mask_files}"
                     for name, layout in LAYOUTS.items())


def layouts_table() -> str:
    """The layouts as a Markdown table for the documentation: name, task, where images and masks lie, the mask
    encoding and the description."""
    rows = ["| layout | task | images | masks | mask encoding | description |", "|---|---|---|---|---|---|"]
    rows += [f"| `{layout.name}` | {layout.task} | `{layout.image_files}` | `{layout.mask_files}` | {layout.encoding} "
             f"| {layout.description} |" for layout in LAYOUTS.values()]
    return "\n".join(rows)
