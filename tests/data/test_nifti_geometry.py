"""A SAML mask must lie on its image's voxel grid (issue 11, case 2): shape, spacing, direction and origin are
compared from the stored affines, before each volume is reoriented, within the float noise real files carry."""

from __future__ import annotations

import numpy as np
import pytest

from feddg.data.check import check_data
from feddg.data.dataset import load_site
from feddg.data.errors import DataError

SHAPE = (24, 20, 6)


def _oblique_affine() -> np.ndarray:
    """An MRI-like affine: 0.625 x 0.625 x 3.6 mm voxels, tilted 12 degrees about x, origin far from zero."""
    t = np.deg2rad(12.0)
    rotation = np.array([[1, 0, 0], [0, np.cos(t), -np.sin(t)], [0, np.sin(t), np.cos(t)]])
    affine = np.eye(4)
    affine[:3, :3] = rotation @ np.diag([0.625, 0.625, 3.6])
    affine[:3, 3] = [-118.3, -97.1, 42.7]
    return affine


def _flip_first_axis(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[:3, 0] *= -1
    return a


def _thicker_slices(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[:3, 2] *= 4.0 / 3.6
    return a


def _shifted_half_voxel(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[:3, 3] += a[:3, 0] * 0.5
    return a


def _write_pair(root, fx, mask_affine) -> tuple:
    rng = np.random.default_rng(0)
    image, mask = fx.prostate_volume(rng, shape=SHAPE)
    image_path = fx.write_nifti(root / "HK" / "Case00.nii.gz", image, _oblique_affine())
    mask_path = fx.write_nifti(root / "HK" / "Case00_segmentation.nii.gz", mask, mask_affine)
    return image_path, mask_path


MISMATCHES = {
    # name: (how the mask's affine differs, the property named, the mask's value as printed)
    "flipped axis": (_flip_first_axis, "direction", "LAS [[-1.0, 0.0, 0.0]"),
    "other slice thickness": (_thicker_slices, "spacing", "[0.625, 0.625, 4.0] mm"),
    "origin shifted half a voxel": (_shifted_half_voxel, "origin", "[-117.9875, -97.1, 42.7] mm"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_mask_on_another_grid_is_refused(tmp_path, fx, case):
    change, name, shown = MISMATCHES[case]
    image_path, mask_path = _write_pair(tmp_path, fx, change(_oblique_affine()))
    cfg = fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK")
    with pytest.raises(DataError) as info:
        load_site(cfg, "HK")
    msg = str(info.value)
    assert msg.startswith(f"site HK: {image_path}, {mask_path}: image/mask geometry mismatch: {name} differs (image ")
    assert f"mask {shown}" in msg
    (problem,) = check_data("saml_nifti", tmp_path)["problems"]
    assert problem == msg


def test_float_noise_of_real_headers_is_accepted(tmp_path, fx):
    """The mask's affine as another tool writes it: rounded to float32, direction cosines off by 5e-5 (a
    re-orthonormalised quaternion), origin off by 1 um. It is the same grid and must load."""
    noisy = _oblique_affine().astype(np.float32).astype(np.float64)
    noisy[:3, :3] += 5e-5 * np.array([[0, 1, 0], [-1, 0, 1], [0, -1, 0]]) * np.array([0.625, 0.625, 3.6])
    noisy[:3, 3] += 1e-3
    _write_pair(tmp_path, fx, noisy)
    test = load_site(fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK"), "HK")["test"]
    assert len(test) == SHAPE[2] and test.labels.any()
    assert check_data("saml_nifti", tmp_path)["ok"]


def test_shape_mismatch_is_still_named_first(tmp_path, fx):
    rng = np.random.default_rng(1)
    image, mask = fx.prostate_volume(rng, shape=SHAPE)
    fx.write_nifti(tmp_path / "HK" / "Case00.nii.gz", image)
    fx.write_nifti(tmp_path / "HK" / "Case00_segmentation.nii.gz", mask[:, :-1], _flip_first_axis(np.eye(4)))
    with pytest.raises(DataError, match=r"image/mask shape mismatch: image \(24, 20, 6\), mask \(24, 19, 6\)"):
        load_site(fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK"), "HK")
