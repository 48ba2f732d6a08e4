"""One rule for reading a NIfTI volume, shared by the training loader and ``feddg segment`` (issue 11, case 6):
trailing axes of length 1 are dropped, the rest must be 3D and finite, and the message says which rule failed."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from feddg.config import config_from_dict
from feddg.data.check import check_data
from feddg.data.dataset import load_site
from feddg.data.errors import DataError
from feddg.data.layouts import read_nifti
from feddg.inference import segment_nifti
from tests.conftest import tiny_experiment

AFFINE = np.array([[0, 0.7, 0, 10], [0.5, 0, 0, -5], [0, 0, -3.0, 2], [0, 0, 0, 1]])  # permuted, one axis flipped


def _volume(shape=(48, 40, 6)) -> np.ndarray:
    v = np.zeros(shape, np.float32)
    v[10:30, 12:30, 1:5] = 100.0
    return v


def _save(path: Path, data: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, AFFINE), path)
    return path


def _with_nan(v: np.ndarray, n: int = 3, value: float = np.nan) -> np.ndarray:
    v = v.copy()
    v.reshape(-1)[:n] = value
    return v


def _segment(scan: Path, out: Path) -> Path:
    cfg = config_from_dict(tiny_experiment("prostate"))
    return segment_nifti(lambda images: images - 1.0, scan, out, cfg)  # z-scored box voxels are far above 1


# ----------------------------------------------------------------------------------------------- the reader


def test_trailing_singleton_axes_are_dropped(tmp_path):
    v = _volume()
    for extra in ((1,), (1, 1)):
        volume = read_nifti(_save(tmp_path / f"v{len(extra)}.nii.gz", v.reshape(v.shape + extra)))
        assert volume.stored.shape == v.shape and volume.data.ndim == 3
        np.testing.assert_allclose(volume.stored.affine, AFFINE)
        np.testing.assert_array_equal(volume.to_stored(volume.data), v)  # back in the file's own voxel order


BAD_VOLUMES = {
    # name: (data, what the message must say, what it must not)
    "NaN voxels": (_with_nan(_volume()), "scan has 3 NaN/Inf voxel(s)", "shape"),
    "Inf voxels in a 4D file with a trailing 1": (_with_nan(_volume(), 2, -np.inf)[..., None],
                                                  "scan has 2 NaN/Inf voxel(s)", "shape"),
    "a time series": (np.zeros((48, 40, 6, 2), np.float32), "scan is not a 3D volume (shape (48, 40, 6, 2))", "NaN"),
    "a 2D image": (np.zeros((48, 40), np.float32), "scan is not a 3D volume (shape (48, 40))", "NaN"),
}


@pytest.mark.parametrize("case", sorted(BAD_VOLUMES))
def test_segment_names_what_is_wrong(tmp_path, case):
    data, says, not_said = BAD_VOLUMES[case]
    scan = _save(tmp_path / "scan.nii.gz", data)
    with pytest.raises(DataError) as info:
        _segment(scan, tmp_path / "out" / "scan_mask.nii.gz")
    msg = str(info.value)
    assert msg.startswith(f"{scan}: ") and says in msg and not_said not in msg.split(": ", 1)[1]
    assert isinstance(info.value, ValueError)  # the CLI reports ValueErrors as errors, exit status 2
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- loader and segment agree


def test_4d_volume_with_trailing_1_passes_the_check_and_segments(tmp_path):
    v = _volume()
    mask = (v > 0).astype(np.uint8)
    scan = _save(tmp_path / "HK" / "Case00.nii.gz", v[..., None])
    _save(tmp_path / "HK" / "Case00_segmentation.nii.gz", mask[..., None])
    assert check_data("saml_nifti", tmp_path)["ok"]
    out = nib.load(_segment(scan, tmp_path / "masks" / "Case00_mask.nii.gz"))
    assert out.shape == v.shape  # written as the 3D volume it is, in the scan's geometry
    np.testing.assert_allclose(out.affine, AFFINE)
    predicted = np.asanyarray(out.dataobj) > 0
    assert 2 * (predicted & (mask > 0)).sum() / (predicted.sum() + mask.sum()) > 0.9


def test_nan_volume_is_refused_alike_by_loader_and_segment(tmp_path, fx):
    v = _with_nan(_volume())
    scan = _save(tmp_path / "HK" / "Case00.nii.gz", v)
    _save(tmp_path / "HK" / "Case00_segmentation.nii.gz", np.zeros(v.shape, np.uint8))
    with pytest.raises(DataError, match=r"^site HK: .*Case00\.nii\.gz: image has 3 NaN/Inf voxel\(s\)$"):
        load_site(fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK"), "HK")
    with pytest.raises(DataError, match=r"Case00\.nii\.gz: scan has 3 NaN/Inf voxel\(s\)$"):
        _segment(scan, tmp_path / "out.nii.gz")
