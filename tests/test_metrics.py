"""Metrics against hand-made masks whose Dice, HD95 and ASD are worked out by hand below.

MONAI's surface of a mask is the mask minus its erosion (the object's own boundary voxels); distances
run between voxel centres. For an axis-aligned box erosion removes one voxel on every side, whichever
structuring element is used, so the surfaces below are easy to enumerate.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from feddg.metrics import case_metrics, image_diagonal, largest_connected_component, summarize


def _squares_shifted_by_two() -> tuple[np.ndarray, np.ndarray]:
    # gt: rows 10..19, cols 10..19 (10x10 = 100 px); pred: the same square moved down 2 rows
    # (rows 12..21). Array shape (1, 32, 32): one structure.
    gt = np.zeros((1, 32, 32), dtype=np.uint8)
    pred = np.zeros_like(gt)
    gt[0, 10:20, 10:20] = 1
    pred[0, 12:22, 10:20] = 1
    return pred, gt


def test_shifted_squares_pixels():
    pred, gt = _squares_shifted_by_two()
    m = case_metrics(pred, gt)["0"]
    # Dice: overlap rows 12..19 = 8 x 10 = 80 px; 2 * 80 / (100 + 100) = 0.8.
    assert m["dice"] == pytest.approx(0.8)
    # Surfaces: 36 boundary px each (100 - 8x8 interior). The shift maps gt's surface onto pred's,
    # so no distance exceeds 2; gt's top row (10 px, row 10) is exactly 2 from pred's nearest
    # surface px (row 12 below it). Directed distances gt->pred, per side of gt's surface:
    #   top row 10, cols 10..19:           2 each                        -> sum 20
    #   bottom row 19: cols 10 and 19 lie on pred's side columns -> 0; cols 11 and 18 -> 1
    #                  (a side column 1 px away); cols 12..17 -> 2     -> sum 0+1+2*6+1+0 = 14
    #   left col 10, rows 11..18: row 11 -> 1 (pred starts at row 12), rows 12..18 -> 0  -> 1
    #   right col 19: likewise                                          -> 1
    # total 36 over 36 px, mean 1.0; pred->gt is the mirror image (same sum).
    # HD95: 16 of 36 distances equal the maximum 2, and torch.quantile's 95th percentile of 36
    # sorted values interpolates between positions 33 and 34, both 2 -> 2 in each direction.
    # Symmetric ASD (MONAI averages the concatenated 72 distances): 72 / 72 = 1.0.
    assert m["hd95"] == pytest.approx(2.0)
    assert m["asd"] == pytest.approx(1.0)
    assert m["empty"] == ""


def test_shifted_squares_isotropic_spacing_scales_distances():
    pred, gt = _squares_shifted_by_two()
    m = case_metrics(pred, gt, spacing=(0.5, 0.5))["0"]
    # Isotropic scaling keeps the nearest neighbours: distances halve, Dice is unchanged.
    assert m["dice"] == pytest.approx(0.8)
    assert m["hd95"] == pytest.approx(1.0)
    assert m["asd"] == pytest.approx(0.5)


def _boxes_shifted_by_one_slice() -> tuple[np.ndarray, np.ndarray]:
    # gt: box rows 4..11, cols 4..11, slices 2..5 (8x8x4 = 256 voxels); pred: moved up 1 slice
    # (slices 3..6). Shape (1, 16, 16, 9), the last axis is the slice axis.
    gt = np.zeros((1, 16, 16, 9), dtype=bool)
    pred = np.zeros_like(gt)
    gt[0, 4:12, 4:12, 2:6] = True
    pred[0, 4:12, 4:12, 3:7] = True
    return pred, gt


def test_anisotropic_3d_distances_in_mm_differ_from_pixels():
    pred, gt = _boxes_shifted_by_one_slice()
    px = case_metrics(pred, gt)["0"]
    mm = case_metrics(pred, gt, spacing=(1.0, 1.0, 3.0))["0"]
    # Dice: overlap 8x8x3 = 192; 2 * 192 / (256 + 256) = 0.75, whatever the spacing.
    assert px["dice"] == pytest.approx(0.75)
    assert mm["dice"] == pytest.approx(0.75)
    # Surfaces: 256 - 6x6x2 interior = 184 voxels each. pred's surface: its face at slice 3
    # (8x8 = 64 voxels), its face at slice 6 (64) and the rings of slices 4 and 5 (28 each).
    # gt's surface: faces at slices 2 and 5, rings at slices 3 and 4.
    # pred->gt, in voxel units (spacing 1):
    #   slice 3: 28 ring voxels sit on gt's ring -> 0; 36 inner voxels -> 1 (gt's face at slice 2)
    #   slices 4, 5 rings: on gt's ring (slice 4) / gt's face (slice 5) -> 0
    #   slice 6 face: 64 voxels, 1 slice above gt's face at slice 5 -> 1
    #   sum 36 + 64 = 100; gt->pred is the mirror image (100). ASD = 200 / 368 = 25/46.
    # In mm with a 3 mm slice step the slice-3 inner voxels may be nearer to gt's in-plane ring at
    # slice 3 than to the face 3 mm below: inner 6x6 block, in-plane distance to the ring
    #   outer ring of the block (20 voxels) 1 mm, next ring (12) 2 mm, centre 2x2 (4) 3 mm (= face)
    #   -> 20 + 24 + 12 = 56; slice 6 face 64 x 3 mm = 192; sum 248 each way. ASD = 496 / 368 = 31/23.
    # HD95: the translation bounds every distance by one slice (1 px, 3 mm); the 64 face voxels at
    # the maximum cover the top 5 % of 184 (quantile positions 173..174) -> 1 px and 3 mm.
    assert px["hd95"] == pytest.approx(1.0)
    assert mm["hd95"] == pytest.approx(3.0)
    assert px["asd"] == pytest.approx(25 / 46, rel=1e-5)
    assert mm["asd"] == pytest.approx(31 / 23, rel=1e-5)


def test_empty_conventions_and_flags():
    # Shape (3, 24, 28): structure 0 prediction empty, 1 both empty, 2 ground truth empty.
    pred = np.zeros((3, 24, 28), dtype=np.uint8)
    gt = np.zeros_like(pred)
    gt[0, 5:10, 5:10] = 1
    pred[2, 5:10, 5:10] = 1
    # Diagonal in px: sqrt(24^2 + 28^2) = sqrt(1360); with spacing (1, 0.25): extent 24 x 7 mm,
    # sqrt(576 + 49) = 25 mm.
    res_px = case_metrics(pred, gt)
    res_mm = case_metrics(pred, gt, spacing=(1.0, 0.25))
    diag_px = math.sqrt(1360)
    assert res_px["0"] == {"dice": 0.0, "hd95": pytest.approx(diag_px), "asd": pytest.approx(diag_px), "empty": "pred"}
    assert res_px["1"] == {"dice": 1.0, "hd95": 0.0, "asd": 0.0, "empty": "both"}
    assert res_px["2"]["empty"] == "gt" and res_px["2"]["dice"] == 0.0
    assert res_mm["0"]["hd95"] == pytest.approx(25.0) and res_mm["0"]["asd"] == pytest.approx(25.0)
    assert res_mm["2"]["hd95"] == pytest.approx(25.0)
    assert image_diagonal((24, 28), (1.0, 0.25)) == pytest.approx(25.0)
    for r in (res_px, res_mm):
        for v in r.values():
            assert all(math.isfinite(v[k]) for k in ("dice", "hd95", "asd"))


def test_case_metrics_rejects_bad_input():
    a = np.zeros((1, 8, 8), dtype=np.uint8)
    with pytest.raises(ValueError, match="same shape"):
        case_metrics(a, np.zeros((1, 8, 9), dtype=np.uint8))
    with pytest.raises(ValueError, match="binary"):
        case_metrics(a + 2, a)
    with pytest.raises(ValueError, match="spacing"):
        case_metrics(a, a, spacing=(1.0, 1.0, 1.0))


def test_summarize_means_counts_and_json_roundtrip():
    pred, gt = _squares_shifted_by_two()  # dice 0.8, hd95 2, asd 1
    perfect = case_metrics(gt, gt)  # dice 1, hd95 0, asd 0
    missed = case_metrics(np.zeros_like(gt), gt)  # dice 0, distances = diagonal sqrt(2048)
    results = [
        {**case_metrics(pred, gt), "case_id": "a"},
        {**perfect, "case_id": "b"},
        {**missed, "case_id": "c"},
    ]
    s = summarize(results, ["prostate"], "px")
    p = s["prostate"]
    # dice: mean (0.8 + 1 + 0) / 3 = 0.6; population std sqrt((0.04 + 0.16 + 0.36) / 3) = sqrt(0.56/3)
    assert p["dice"]["mean"] == pytest.approx(0.6)
    assert p["dice"]["std"] == pytest.approx(math.sqrt(0.56 / 3))
    diag = math.sqrt(32**2 + 32**2)
    assert p["hd95"]["mean"] == pytest.approx((2.0 + 0.0 + diag) / 3)
    assert p["asd"]["mean"] == pytest.approx((1.0 + 0.0 + diag) / 3)
    assert (p["n_cases"], p["empty_pred"], p["empty_gt"], p["empty_both"]) == (3, 1, 0, 0)
    assert s["unit"] == "px"
    # Results that went through JSON (string keys) summarize the same.
    assert summarize(json.loads(json.dumps(results)), ["prostate"], "px") == s
    # Every number is a finite Python float.
    for m in ("dice", "hd95", "asd"):
        for v in p[m].values():
            assert type(v) is float and math.isfinite(v)


def test_summarize_two_structures_and_errors():
    pred = np.zeros((2, 16, 16), dtype=np.uint8)
    gt = np.zeros_like(pred)
    gt[:, 4:8, 4:8] = 1
    pred[0, 4:8, 4:8] = 1  # disc perfect, cup missed
    s = summarize([case_metrics(pred, gt, spacing=(0.1, 0.1))], ["disc", "cup"], "mm")
    assert s["disc"]["dice"] == {"mean": 1.0, "std": 0.0}
    assert s["cup"]["dice"]["mean"] == 0.0 and s["cup"]["empty_pred"] == 1
    assert s["cup"]["hd95"]["mean"] == pytest.approx(math.sqrt(1.6**2 * 2))
    with pytest.raises(ValueError, match="unit"):
        summarize([case_metrics(pred, gt)], ["disc", "cup"], "cm")
    with pytest.raises(ValueError, match="no case"):
        summarize([], ["disc"], "px")


def test_largest_connected_component_removes_island():
    m = np.zeros((3, 20, 20), dtype=np.uint8)
    m[0, 2:8, 2:8] = 1  # 36 px body
    m[0, 15:17, 15:17] = 1  # 4 px island: removed
    m[1, 10:12, 10:12] = 1  # 4 px
    m[1, 12, 12] = 1  # touches the square only diagonally: kept (8-connectivity) -> 5 px component
    m[1, 0:2, 0:2] = 1  # 4 px elsewhere: removed
    out = largest_connected_component(m)
    assert out.dtype == m.dtype and out.shape == m.shape
    expected0 = np.zeros((20, 20), dtype=np.uint8)
    expected0[2:8, 2:8] = 1
    np.testing.assert_array_equal(out[0], expected0)
    assert out[1].sum() == 5 and out[1, 12, 12] == 1 and out[1, 0:2, 0:2].sum() == 0
    assert out[2].sum() == 0  # empty stays empty
    # Post-processing a prediction with a false-positive island raises its Dice back to 1.
    gt = np.zeros((1, 20, 20), dtype=np.uint8)
    gt[0, 2:8, 2:8] = 1
    assert case_metrics(m[:1], gt)["0"]["dice"] == pytest.approx(2 * 36 / (40 + 36))
    assert case_metrics(out[:1], gt)["0"]["dice"] == pytest.approx(1.0)


def test_largest_connected_component_3d():
    m = np.zeros((1, 10, 10, 6), dtype=bool)
    m[0, 1:5, 1:5, 0:3] = True  # 48 voxels
    m[0, 7:9, 7:9, 4:6] = True  # 8 voxels
    out = largest_connected_component(m)
    assert out.sum() == 48 and not out[0, 7:9, 7:9, 4:6].any()


def test_dice_alone_without_distances_is_the_same_dice():
    rng = np.random.default_rng(3)
    gt = np.zeros((2, 24, 24), bool)
    gt[0, 5:15, 5:15] = True
    gt[1, 8:12, 8:12] = True
    pred = gt ^ (rng.random(gt.shape) > 0.9)
    pred[1] = False  # an empty prediction: the convention's Dice 0
    full = case_metrics(pred, gt, (1.0, 1.0))
    dice_only = case_metrics(pred, gt, (1.0, 1.0), distances=False)
    for l in ("0", "1"):
        assert set(dice_only[l]) == {"dice", "empty"}
        assert dice_only[l]["dice"] == full[l]["dice"] and dice_only[l]["empty"] == full[l]["empty"]
