"""Plausibility limits shared by every layout: how much of an image a structure may cover, how large an image may be.

Suspicious but usable input (a mask covering most of the image, an image far larger than the task needs) gives a
:class:`~feddg.data.errors.DataWarning`, not an error; the data check and the loader word it alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import DataWarning
from .registry import layout_spec

# The largest share of all pixels of one split that a structure can plausibly cover. Real masks stay far below it:
# the prostate covers 0.7-1.2% of the MiDSS slices (all six sites' samples), the optic disc 7.6-18.5% of the 800 px
# DoFE ROIs (all four domains). More than half of all pixels means an inverted encoding (slice_png's prostate is 0, not
# 255) or a label the reader does not see; it is a warning, not an error, because a tightly cropped data set may
# legitimately come closer than the public ones. The cup lies inside the disc, so the disc's limit covers it.
MAX_FOREGROUND_SHARE: dict[str, float] = {"prostate": 0.5, "disc": 0.5}

# The longest image side the task ever needs. The networks see 384 px; the public fundus ROIs are 800 px, the whole
# fundus photographs they are cut from about 1400-2900 px (REFUGE, RIM-ONE, Drishti-GS), MRI slices 256-512 px.
# 4096 px leaves room for any camera in use, and bounds one decoded image as float32 at 4096 x 4096 x 3 x 4 B = 192 MiB,
# where an 8000 px photograph costs 730 MiB per copy. Larger images are reduced to it in 8 bits, with a warning.
MAX_IMAGE_SIDE = 4096


def foreground_warnings(layout: str, site: str, split: str, share: Mapping[str, float]) -> list[DataWarning]:
    """A warning for each structure covering more of ``split``'s pixels than :data:`MAX_FOREGROUND_SHARE` allows.

    ``share``: structure -> its share of all pixels of the split. The data check and the loader both call this, so
    they warn alike.
    """
    spec = layout_spec(layout)
    warnings = []
    for name, value in share.items():
        limit = MAX_FOREGROUND_SHARE.get(name)
        if limit is not None and value > limit:
            reason = (
                f"split {split}: {name} covers {value:.1%} of all pixels, implausible for {spec.task} data (more than "
                f"{limit:.0%}); is the mask encoding inverted? {spec.name} masks must be {spec.encoding}"
            )
            warnings.append(DataWarning(reason, site=site))
    return warnings


def capped_size(size: tuple[int, int]) -> tuple[int, int]:
    """(H, W) scaled down, aspect ratio kept, so that the longest side is at most :data:`MAX_IMAGE_SIDE`."""
    longest = max(size)
    if longest <= MAX_IMAGE_SIDE:
        return size
    scale = MAX_IMAGE_SIDE / longest
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))
