"""Fixtures for the data-layer tests: the real public samples (skipped when absent) and tiny on-disk sites
written into tmp_path in each of the three layouts."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from feddg.config import DataConfig
from tests.conftest import SHARED_DATA

PROSTATE_SITES = ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"]
FUNDUS_SITES = ["Domain1", "Domain2", "Domain3", "Domain4"]


@pytest.fixture(scope="session")
def samples() -> Path:
    """The real MiDSS sample folder (../shared/data/midss-samples next to the repository)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real sample data not found at {SHARED_DATA.resolve()} (a user's clone has no ../shared)")
    return SHARED_DATA.resolve()


@pytest.fixture(scope="session")
def fx():
    """This module: the fixture writers below, used as ``fx.make_saml_site(...)`` (importing ``conftest`` by name
    would be ambiguous once other test folders have their own conftest.py)."""
    return sys.modules[__name__]


def tree_hash(root: Path) -> str:
    """Names, sizes, modification times and contents of every file and folder under root."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        st = p.stat()
        h.update(f"{p.relative_to(root)}|{p.is_dir()}|{st.st_mtime_ns}|{st.st_mode}".encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def write_png(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)
    return path


def write_nifti(path: Path, array: np.ndarray, affine: np.ndarray | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.asarray(array), np.diag([0.5, 0.6, 3.0, 1.0]) if affine is None else affine), path)
    return path


def prostate_volume(rng: np.random.Generator, shape=(24, 20, 6), fg_slices=(2, 3)) -> tuple[np.ndarray, np.ndarray]:
    """(image float32, mask uint8) of shape (X, Y, Z): noise plus a bright box labelled 1 on ``fg_slices``."""
    image = rng.normal(300.0, 40.0, shape).astype(np.float32)
    mask = np.zeros(shape, np.uint8)
    x, y = shape[0] // 4, shape[1] // 4
    for z in fg_slices:
        mask[x : 3 * x, y : 3 * y, z] = 1
    image[mask > 0] += 200.0
    return image, mask


def make_saml_site(root: Path, site: str, n_cases: int, seg: str = "segmentation", seed: int = 0, **kw) -> Path:
    """``<root>/<site>/CaseNN.nii.gz`` + ``CaseNN_<seg>.nii.gz`` for n_cases volumes."""
    rng = np.random.default_rng(seed)
    for i in range(n_cases):
        image, mask = prostate_volume(rng, **kw)
        write_nifti(root / site / f"Case{i:02d}.nii.gz", image)
        write_nifti(root / site / f"Case{i:02d}_{seg}.nii.gz", mask)
    return root / site


def slice_png_pair(rng: np.random.Generator, size=(40, 32), empty: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(image uint8, mask uint8 with prostate = 0, background = 255)."""
    image = rng.integers(0, 120, size).astype(np.uint8)
    mask = np.full(size, 255, np.uint8)
    if not empty:
        mask[10:25, 8:20] = 0
        image[10:25, 8:20] += 100
    return image, mask


def make_slice_site(root: Path, site: str, cases: dict[str, dict[str, int]], seed: int = 0, empty=()) -> Path:
    """``<root>/<site>/<split>/{image,mask}/<case>_<slice>.png``; cases: split -> {case: n_slices}.
    Slices whose (split, case, slice) is in ``empty`` have no foreground."""
    rng = np.random.default_rng(seed)
    for split, per_case in cases.items():
        for case, n in per_case.items():
            for k in range(n):
                image, mask = slice_png_pair(rng, empty=(split, case, k) in empty)
                write_png(root / site / split / "image" / f"{case}_{k:02d}.png", image)
                write_png(root / site / split / "mask" / f"{case}_{k:02d}.png", mask)
    return root / site


def fundus_pair(rng: np.random.Generator, size=(48, 64)) -> tuple[np.ndarray, np.ndarray]:
    """(RGB image (H, W, 3) uint8, 3-channel mask with cup = 0, rim = 128, background = 255)."""
    h, w = size
    image = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
    yy, xx = np.mgrid[:h, :w]
    r = np.hypot(yy - h / 2, xx - w / 2)
    m = np.full((h, w), 255, np.uint8)
    m[r < 14] = 128
    m[r < 7] = 0
    return image, np.repeat(m[..., None], 3, axis=2)


def make_dofe_site(root: Path, site: str, names: dict[str, list[str]], seed: int = 0) -> Path:
    """``<root>/<site>/<split>/ROIs/{image,mask}/<name>.png``; names: split -> file stems."""
    rng = np.random.default_rng(seed)
    for split, stems in names.items():
        for stem in stems:
            image, mask = fundus_pair(rng)
            write_png(root / site / split / "ROIs" / "image" / f"{stem}.png", image)
            write_png(root / site / split / "ROIs" / "mask" / f"{stem}.png", mask)
    return root / site


def config(root: Path | str, layout: str, sites: list[str], unseen: str | None = None, **kw) -> DataConfig:
    task = "fundus" if layout == "dofe_png" else "prostate"
    return DataConfig(
        task=task, layout=layout, root=str(root), sites=list(sites), unseen_site=unseen or sites[-1],
        image_size=kw.pop("image_size", 16), **kw,
    )
