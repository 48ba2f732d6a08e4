"""PNG masks and images that were accepted silently (issue 11): labels held in the alpha channel (case 3), masks
whose foreground share is implausible for the task, e.g. an inverted encoding (case 3), and images far larger than
the task needs, which must be reduced in 8 bits with a warning and bounded memory (case 5)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from feddg.data.check import check_data, format_report
from feddg.data.dataset import load_site
from feddg.data.errors import DataError
from feddg.data.layouts import MAX_IMAGE_SIDE, CaseRecord, read_record
from tests.conftest import REPOSITORY


# ----------------------------------------------------------------------------------------------- alpha channel


def _alpha_label(rgb: tuple[int, int, int], shape=(40, 32)) -> Image.Image:
    """An RGBA mask whose colour is constant: the label (a box) exists only in the alpha channel."""
    alpha = np.zeros(shape, np.uint8)
    alpha[10:25, 8:20] = 255
    colour = np.broadcast_to(np.array(rgb, np.uint8), shape + (3,))
    return Image.fromarray(np.dstack([colour, alpha]), "RGBA")


def _la_label() -> Image.Image:
    return _alpha_label((0, 0, 0)).convert("LA")


def _palette_transparency_label() -> Image.Image:
    """Palette entries 0 and 1 are both black; entry 1 is transparent (tRNS) and marks the background."""
    index = np.ones((40, 32), np.uint8)
    index[10:25, 8:20] = 0
    im = Image.fromarray(index, "P")
    im.putpalette([0, 0, 0, 0, 0, 0])
    im.info["transparency"] = 1
    return im


ALPHA_MASKS = {
    # name: (layout, site writer, mask to replace, new mask)
    "slice RGBA": ("slice_png", "train/mask/00_00.png", lambda: _alpha_label((0, 0, 0))),
    "slice LA": ("slice_png", "test/mask/05_00.png", _la_label),
    "slice palette with transparency": ("slice_png", "train/mask/00_01.png", _palette_transparency_label),
    "fundus RGBA": ("dofe_png", "train/ROIs/mask/g1.png", lambda: _alpha_label((255, 255, 255), (48, 64))),
}


def _site(layout: str, root: Path, fx) -> Path:
    if layout == "slice_png":
        return fx.make_slice_site(root, "HK", {"train": {"00": 2, "01": 1}, "test": {"05": 1}})
    return fx.make_dofe_site(root, "HK", {"train": ["g1", "g2"], "test": ["t1"]})


@pytest.mark.parametrize("case", sorted(ALPHA_MASKS))
def test_label_in_the_alpha_channel_is_refused(tmp_path, fx, case):
    layout, rel, make = ALPHA_MASKS[case]
    bad = _site(layout, tmp_path, fx) / rel
    make().save(bad)
    cfg = fx.config(tmp_path, layout, ["HK", "UCL"], unseen="UCL")
    with pytest.raises(DataError) as info:
        load_site(cfg, "HK")
    assert str(info.value) == (
        f"site HK: {bad}: mask has a non-constant alpha channel (values 0..255): labels must be stored in the gray "
        "or colour channels, the alpha channel is not read"
    )
    assert check_data(layout, tmp_path, ["HK"])["problems"] == [str(info.value)]


def test_constant_alpha_is_read_as_before(tmp_path, fx):
    site = _site("slice_png", tmp_path, fx)
    path = site / "train" / "mask" / "00_00.png"
    before = load_site(fx.config(tmp_path, "slice_png", ["HK"], unseen="HK"), "HK")["test"]
    Image.open(path).convert("RGBA").save(path)  # opaque everywhere
    after = load_site(fx.config(tmp_path, "slice_png", ["HK"], unseen="HK"), "HK")["test"]
    np.testing.assert_array_equal(after.labels, before.labels)


# ----------------------------------------------------------------------------------------------- foreground share


def _invert_slice_masks(site: Path, split: str) -> None:
    for p in (site / split / "mask").iterdir():
        Image.fromarray(255 - np.asarray(Image.open(p))).save(p)


def _swap_fundus_cup_and_background(site: Path, split: str) -> None:
    for p in (site / split / "ROIs" / "mask").iterdir():
        a = np.asarray(Image.open(p))
        b = a.copy()
        b[a == 0], b[a == 255] = 255, 0
        Image.fromarray(b).save(p)


INVERTED = {
    "slice_png": (_invert_slice_masks, "prostate", "0 = prostate, 255 = background"),
    "dofe_png": (_swap_fundus_cup_and_background, "disc", "0 = cup, 128 = rim, 255 = background"),
}


@pytest.mark.parametrize("layout", sorted(INVERTED))
def test_implausible_foreground_share_warns_in_check_and_log(tmp_path, fx, caplog, layout):
    invert, structure, encoding = INVERTED[layout]
    invert(_site(layout, tmp_path, fx), "train")
    report = check_data(layout, tmp_path)
    assert report["ok"] is True and report["problems"] == []  # usable data: a warning, not a problem
    (warning,) = report["sites"]["HK"]["warnings"]
    assert report["warnings"] == [warning]
    assert warning.startswith(f"site HK: split train: {structure} covers ")
    assert "of all pixels, implausible" in warning and "is the mask encoding inverted?" in warning
    assert encoding in warning
    text = format_report(report)
    assert "1 warning(s)" in text and warning in text and text.endswith("no problems found")

    with caplog.at_level(logging.WARNING, logger="feddg.data.dataset"):
        load_site(fx.config(tmp_path, layout, ["HK", "UCL"], unseen="UCL", val_fraction=0.0), "HK")
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"site HK: split train: {structure} covers " in m for m in logged), logged
    assert not any("split test" in m for m in logged), "the test split is not inverted"


def test_real_samples_give_no_warning(samples):
    for layout, folder in (("slice_png", "ProstateSlice"), ("dofe_png", "Fundus")):
        assert check_data(layout, samples / folder)["warnings"] == []


# ----------------------------------------------------------------------------------------------- oversized images


def _wide_pair(site: Path, layout: str, width: int) -> CaseRecord:
    """A (40, width) image with a bright box where its mask has the label; the box edges are even, so a reduction
    by 2 maps them exactly."""
    sub = ("image", "mask") if layout == "slice_png" else ("ROIs/image", "ROIs/mask")
    image = np.full((40, width), 30, np.uint8)
    mask = np.full((40, width), 255, np.uint8)
    image[10:30, 1000:3000] = 230
    mask[10:30, 1000:3000] = 0 if layout == "slice_png" else 128
    if layout == "dofe_png":
        image, mask = np.dstack([image] * 3), np.dstack([mask] * 3)
    paths = [site / "test" / s / "00_00.png" for s in sub]
    for path, array in zip(paths, (image, mask)):
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(path)
    return CaseRecord(site.name, "00", "test", *paths)


@pytest.mark.parametrize("layout", ["slice_png", "dofe_png"])
def test_oversized_image_is_reduced_with_a_warning(tmp_path, fx, caplog, layout):
    rec = _wide_pair(tmp_path / "HK", layout, width=2 * MAX_IMAGE_SIDE)
    d = read_record(layout, rec)
    assert d.shape[:2] == (40, 2 * MAX_IMAGE_SIDE)  # the stored size is reported
    assert d.image.shape[-2:] == d.labels.shape[-2:] == (20, MAX_IMAGE_SIDE)
    np.testing.assert_array_equal(d.labels[0, 0], d.image[0, 0] > 128)  # the mask stays on the image
    (warning,) = d.warnings
    text = str(warning)
    assert text.startswith(f"site HK: {rec.image_path}, {rec.mask_path}: image and mask are 40x8192 px, larger than")
    assert "reduced to 20x4096 px in 8 bits" in text

    if layout == "slice_png":  # a site has both splits (check-data refuses one without train/)
        fx.make_slice_site(tmp_path, "HK", {"train": {"01": 1}})
    else:
        fx.make_dofe_site(tmp_path, "HK", {"train": ["g1"]})
    report = check_data(layout, tmp_path)
    assert report["ok"] is True and report["warnings"] == [text]
    with caplog.at_level(logging.WARNING, logger="feddg.data.dataset"):
        load_site(fx.config(tmp_path, layout, ["HK"], unseen="HK"), "HK")
    assert any(text in r.getMessage() for r in caplog.records)


_PEAK = """
import resource, sys
from pathlib import Path
from feddg.data.layouts import CaseRecord, read_record
test = Path(sys.argv[1]) / "HK" / "test"
rec = CaseRecord("HK", "00", "test", test / "image" / "00_00.png", test / "mask" / "00_00.png")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
d = read_record("slice_png", rec)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, d.image.shape[-1], int(d.labels.sum()))
print(*d.warnings, file=sys.stderr)
"""


def test_oversized_image_memory_stays_bounded(tmp_path):
    """An 8000 x 8000 pair (64 MiB per file in 8 bits; cheap to write: constant with one box), decoded in a fresh
    process. Converted to float32 at full size it peaked at ~610 MiB; reduced in 8 bits first, at ~185 MiB."""
    n = 8000
    for sub, background, box in (("image", 40, 200), ("mask", 255, 0)):
        im = Image.new("L", (n, n), background)
        ImageDraw.Draw(im).rectangle((n // 4, n // 4, n // 2 - 1, n // 2 - 1), fill=box)
        (tmp_path / "HK" / "test" / sub).mkdir(parents=True)
        im.save(tmp_path / "HK" / "test" / sub / "00_00.png")
        del im
    run = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path)], capture_output=True, text=True, cwd=REPOSITORY,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    peak_kib, side, foreground = map(int, run.stdout.split())
    assert peak_kib < 300 * 1024, f"decoding grew the peak memory by {peak_kib // 1024} MiB"
    assert side == MAX_IMAGE_SIDE
    assert foreground == pytest.approx((n // 4 * MAX_IMAGE_SIDE / n) ** 2, rel=0.01)  # the box, at the new scale
    assert "image and mask are 8000x8000 px, larger than the 4096 px" in run.stderr
