"""load_site: preprocessing, splits, validation errors and the torch loader."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from feddg.config import DataConfig
from feddg.data.dataset import SliceSet, load_site, make_loader, split_cases
from feddg.data.errors import DataError

SAML_SITES = ["BIDMC", "BMC", "HK"]


def _shapes(s: SliceSet, c: int, n_labels: int, size: int) -> None:
    assert s.images.shape[1:] == (c, size, size) and s.images.dtype == np.float32
    assert s.labels.shape[1:] == (n_labels, size, size) and s.labels.dtype == np.uint8
    assert len(s.case_ids) == len(s) == len(s.slice_index) == len(s.labels)
    assert set(np.unique(s.labels)) <= {0, 1}


# ----------------------------------------------------------------------------------------------- real samples


def test_real_fundus_disc_contains_cup(samples, fx):
    cfg = fx.config(samples / "Fundus", "dofe_png", fx.FUNDUS_SITES, image_size=64)
    for site in fx.FUNDUS_SITES:
        out = load_site(cfg, site)
        assert set(out) == {"train", "val", "test"}
        both = [s for s in out.values() if len(s)]
        assert sum(len(s) for s in both) == 2
        for s in out.values():
            _shapes(s, 3, 2, 64)
            assert s.spacing is None
        for s in both:
            disc, cup = s.labels[:, 0], s.labels[:, 1]
            assert (cup <= disc).all(), "cup outside the disc"
            assert disc.reshape(len(s), -1).any(1).all() and cup.reshape(len(s), -1).any(1).all()
            assert (disc.sum() > cup.sum()) and disc.mean() < 0.5
            assert s.images.min() >= -1.0 and s.images.max() <= 1.0


def test_real_prostate_slices(samples, fx):
    cfg = fx.config(samples / "ProstateSlice", "slice_png", fx.PROSTATE_SITES, unseen="RUNMC", image_size=64)
    out = load_site(cfg, "BIDMC")
    assert (len(out["train"]), len(out["val"]), len(out["test"])) == (1, 0, 1)
    assert out["train"].case_ids == ["train/00"] and out["test"].case_ids == ["test/00"]
    for s in out.values():
        _shapes(s, 1, 1, 64)
    for s in (out["train"], out["test"]):
        assert 0 < s.labels.mean() < 0.2  # prostate = black pixels of the inverted mask, a small region
        assert abs(float(s.images.mean())) < 1e-4 and abs(float(s.images.std()) - 1) < 1e-3


def test_real_unseen_site_is_all_test(samples, fx):
    cfg = fx.config(samples / "ProstateSlice", "slice_png", fx.PROSTATE_SITES, unseen="RUNMC")
    out = load_site(cfg, "RUNMC")
    assert (len(out["train"]), len(out["val"]), len(out["test"])) == (0, 0, 2)
    assert out["test"].case_ids == ["train/00", "test/00"]
    _shapes(out["train"], 1, 1, 16)


def test_real_i2cvb_unpaired_is_an_error(samples, fx):
    cfg = fx.config(samples / "ProstateSlice", "slice_png", fx.PROSTATE_SITES)
    with pytest.raises(DataError, match=r"site I2CVB: .*image/00_01\.png, .*mask/00_00\.png: unpaired"):
        load_site(cfg, "I2CVB")


# ----------------------------------------------------------------------------------------------- NIfTI fixtures


def test_nifti_non_canonical_affine_spacing_and_orientation(tmp_path, fx):
    # Voxel axis 0 runs along +z (3 mm), axis 1 along -y (0.6 mm), axis 2 along +x (0.5 mm).
    affine = np.array([[0, 0, 0.5, 0], [0, -0.6, 0, 0], [3.0, 0, 0, 0], [0, 0, 0, 1.0]])
    image = np.random.default_rng(0).normal(0, 1, (5, 20, 24)).astype(np.float32)
    mask = np.zeros((5, 20, 24), np.uint8)
    mask[1:3, 0:5, 0:8] = 1  # slices 1-2; anterior (small voxel axis 1 = large y), right-most x
    fx.write_nifti(tmp_path / "UCL" / "Case07.nii.gz", image, affine)
    fx.write_nifti(tmp_path / "UCL" / "Case07_segmentation.nii.gz", mask, affine)
    cfg = fx.config(tmp_path, "saml_nifti", ["HK", "UCL"], unseen="UCL")
    test = load_site(cfg, "UCL")["test"]
    _shapes(test, 1, 1, 16)
    # Canonical (RAS) volume is (x=24, y=20, z=5); in-plane spacing is scaled to the 16x16 network grid.
    assert test.spacing == {"Case07": pytest.approx((0.5 * 24 / 16, 0.6 * 20 / 16, 3.0))}
    assert test.slice_index.tolist() == [0, 1, 2, 3, 4]
    assert test.labels.reshape(5, -1).any(1).tolist() == [False, True, True, False, False]
    # Rows are x: voxels 0..7 of 24 -> rows 0..4 of 16 (nearest, pixel centres). Columns are y = 19 - axis 1:
    # voxels 15..19 of 20 -> columns 12..15 of 16. A flipped or transposed slice would put it elsewhere.
    fg = test.labels[1, 0]
    assert fg[:5, 12:].all() and fg.sum() == 5 * 4


def test_nifti_spacing_follows_header_zooms(tmp_path, fx):
    import nibabel as nib

    fx.make_saml_site(tmp_path, "HK", 1, shape=(32, 24, 4))
    zooms = nib.as_closest_canonical(nib.load(tmp_path / "HK" / "Case00.nii.gz")).header.get_zooms()
    cfg = fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK")
    assert load_site(cfg, "HK")["test"].spacing["Case00"] == pytest.approx(
        (zooms[0] * 32 / 16, zooms[1] * 24 / 16, zooms[2])
    )


def test_bmc_spelling_and_label_two_is_prostate(tmp_path, fx):
    fx.make_saml_site(tmp_path, "BMC", 2, seg="Segmentation", fg_slices=(2,))
    mask_path = tmp_path / "BMC" / "Case01_Segmentation.nii.gz"
    import nibabel as nib

    m = np.asarray(nib.load(mask_path).dataobj).copy()
    m[4:12, 4:12, 4] = 2  # slice 4 carries only label 2
    fx.write_nifti(mask_path, m)
    cfg = fx.config(tmp_path, "saml_nifti", ["BMC"], unseen="BMC")
    test = load_site(cfg, "BMC")["test"]
    idx = test.case_indices()["Case01"]
    assert test.labels[idx].reshape(len(idx), -1).any(1).tolist() == [False, False, True, False, True, False]
    assert set(np.unique(test.labels)) == {0, 1}


def test_volume_zscore_and_slice_zscore(tmp_path, fx):
    fx.make_saml_site(tmp_path, "HK", 2)
    cfg = fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK")
    test = load_site(cfg, "HK")["test"]
    for idx in test.case_indices().values():
        v = test.images[idx]
        assert abs(v.mean()) < 1e-4 and abs(v.std() - 1) < 1e-3
        assert np.ptp(v.mean(axis=(1, 2, 3))) > 0.05  # slices are not individually centred
    cfg.zscore = "slice"
    test = load_site(cfg, "HK")["test"]
    assert np.allclose(test.images.mean(axis=(1, 2, 3)), 0, atol=1e-4)
    assert np.allclose(test.images.std(axis=(1, 2, 3)), 1, atol=1e-3)


def test_constant_volume_has_no_nan(tmp_path, fx):
    shape = (16, 16, 3)
    fx.write_nifti(tmp_path / "HK" / "Case00.nii.gz", np.full(shape, 7.0, np.float32))
    fx.write_nifti(tmp_path / "HK" / "Case00_segmentation.nii.gz", np.zeros(shape, np.uint8))
    test = load_site(fx.config(tmp_path, "saml_nifti", ["HK"], unseen="HK"), "HK")["test"]
    assert np.isfinite(test.images).all() and np.allclose(test.images, 0)


# ----------------------------------------------------------------------------------------------- splits


def test_split_cases_is_case_level_deterministic_and_seeded():
    cases = [f"Case{i:02d}" for i in range(10)]
    train, val = split_cases(cases * 3, 0.2, 0, "HK")
    assert len(val) == 2 and not set(train) & set(val) and sorted(train + val) == cases
    assert split_cases(cases, 0.2, 0, "HK") == (train, val)
    draws = {tuple(split_cases(cases, 0.2, seed, "HK")[1]) for seed in range(6)}
    assert len(draws) > 1, "different seeds should give different validation cases"
    assert len({tuple(split_cases(cases, 0.2, 0, site)[1]) for site in ("A", "B", "C", "D", "E", "F")}) > 1
    assert len(split_cases(cases[:2], 0.01, 0, "HK")[1]) == 1  # at least one validation case
    assert split_cases(cases[:2], 0.9, 0, "HK")[0] != []  # never all cases
    assert split_cases(cases[:1], 0.5, 0, "HK") == (cases[:1], [])
    assert split_cases(cases, 0.0, 0, "HK") == (cases, [])


def test_load_site_train_val_disjoint_by_case(tmp_path, fx):
    fx.make_slice_site(tmp_path, "BMC", {"train": {f"{i:02d}": 3 for i in range(8)}, "test": {"00": 2, "01": 2}})
    cfg = fx.config(tmp_path, "slice_png", ["BMC", "HK"], unseen="HK", val_fraction=0.25)
    out = load_site(cfg, "BMC")
    train, val = set(out["train"].case_ids), set(out["val"].case_ids)
    assert len(val) == 2 and len(train) == 6 and not train & val
    assert len(out["val"]) == 6 and len(out["train"]) == 18  # whole cases, every slice of each
    assert set(out["test"].case_ids) == {"test/00", "test/01"} and len(out["test"]) == 4
    assert load_site(cfg, "BMC")["val"].case_ids == out["val"].case_ids
    cfg.split_seed = 1
    others = {tuple(sorted(set(load_site(cfg, "BMC")["val"].case_ids)))}
    for seed in (2, 3, 4):
        cfg.split_seed = seed
        others.add(tuple(sorted(set(load_site(cfg, "BMC")["val"].case_ids))))
    assert others - {tuple(sorted(val))}, "the split does not depend on the seed"


def test_unseen_nifti_site_is_all_test(tmp_path, fx):
    fx.make_saml_site(tmp_path, "HK", 4)
    out = load_site(fx.config(tmp_path, "saml_nifti", ["BIDMC", "HK"], unseen="HK"), "HK")
    assert len(out["train"]) == len(out["val"]) == 0 and len(out["test"]) == 4 * 6
    _shapes(out["train"], 1, 1, 16)
    assert out["train"].spacing == {} and len(out["test"].spacing) == 4


def test_nifti_training_site_has_no_test_split(tmp_path, fx):
    fx.make_saml_site(tmp_path, "HK", 5)
    out = load_site(fx.config(tmp_path, "saml_nifti", ["HK", "UCL"], unseen="UCL"), "HK")
    assert len(out["test"]) == 0
    assert len(set(out["val"].case_ids)) == 1 and len(set(out["train"].case_ids)) == 4
    assert set(out["train"].spacing) == set(out["train"].case_ids)


def test_empty_slices_dropped_only_in_train(tmp_path, fx):
    fx.make_saml_site(tmp_path, "HK", 5, fg_slices=(2, 3))
    cfg = fx.config(tmp_path, "saml_nifti", ["HK", "UCL"], unseen="UCL", val_fraction=0.4)
    out = load_site(cfg, "HK")
    assert len(out["train"]) == 3 * 2 and out["train"].labels.reshape(6, -1).any(1).all()
    assert sorted(set(out["train"].slice_index.tolist())) == [2, 3]
    assert len(out["val"]) == 2 * 6 and not out["val"].labels.reshape(12, -1).any(1).all()
    cfg.train_empty_slices = True
    assert len(load_site(cfg, "HK")["train"]) == 3 * 6


def test_case_indices_slice_order_and_subset():
    s = SliceSet(
        "HK", np.arange(5, dtype=np.float32).reshape(5, 1, 1, 1), np.zeros((5, 1, 1, 1), np.uint8),
        ["a", "b", "a", "a", "b"], np.array([2, 1, 0, 1, 0]), {"a": (1.0, 1.0, 3.0), "b": (2.0, 2.0, 3.0)},
    )
    ci = s.case_indices()
    assert list(ci) == ["a", "b"] and ci["a"].tolist() == [2, 3, 0] and ci["b"].tolist() == [4, 1]
    sub = s.subset([1, 4])
    assert sub.case_ids == ["b", "b"] and sub.spacing == {"b": (2.0, 2.0, 3.0)} and len(sub) == 2
    assert s.subset(np.array([True, False, False, False, False])).images.ravel().tolist() == [0.0]


# ----------------------------------------------------------------------------------------------- errors


def test_unknown_site_names_known_sites(tmp_path, fx):
    cfg = fx.config(tmp_path, "saml_nifti", ["BIDMC", "HK"])
    with pytest.raises(DataError, match=r"site Nowhere: unknown site 'Nowhere'.*BIDMC.*HK"):
        load_site(cfg, "Nowhere")


def test_layout_task_mismatch(tmp_path, fx):
    cfg = fx.config(tmp_path, "dofe_png", ["Domain1"])
    cfg.task = "prostate"
    with pytest.raises(DataError, match=r"site Domain1: layout 'dofe_png' holds fundus data but the task is"):
        load_site(cfg, "Domain1")


def _truncate(p: Path) -> None:
    b = p.read_bytes()
    p.write_bytes(b[: len(b) // 2])


def _rewrite_png(p: Path, fn) -> None:
    from PIL import Image

    a = np.asarray(Image.open(p)).copy()
    Image.fromarray(fn(a)).save(p)


def _rewrite_nifti(p: Path, fn) -> None:
    import nibabel as nib

    img = nib.load(p)
    a = fn(np.asarray(img.dataobj).copy())
    nib.save(nib.Nifti1Image(a, img.affine), p)


def _slice_site(root: Path, fx) -> Path:
    return fx.make_slice_site(root, "HK", {"train": {"00": 2, "01": 1}, "test": {"05": 1}})


def _dofe_site(root: Path, fx) -> Path:
    return fx.make_dofe_site(root, "HK", {"train": ["g1", "g2"], "test": ["t1"]})


def _saml_site(root: Path, fx) -> Path:
    return fx.make_saml_site(root, "HK", 2)


BAD_INPUTS = {
    # name: (layout, site writer, file to break, how, expected reason)
    "truncated png image": ("slice_png", _slice_site, "test/image/05_00.png", _truncate, "cannot read image file"),
    "garbage png mask": ("slice_png", _slice_site, "train/mask/00_01.png",
                         lambda p: p.write_bytes(b"\x89PNG garbage"), "cannot read mask file"),
    "png shape mismatch": ("slice_png", _slice_site, "train/mask/01_00.png",
                           lambda p: _rewrite_png(p, lambda a: a[:, :-2]), "shape mismatch"),
    "slice mask value": ("slice_png", _slice_site, "train/mask/00_00.png",
                         lambda p: _rewrite_png(p, lambda a: np.where(a == 0, 7, a).astype(np.uint8)),
                         "mask contains values {7} outside the slice_png encoding"),
    "fundus mask value": ("dofe_png", _dofe_site, "train/ROIs/mask/g2.png",
                          lambda p: _rewrite_png(p, lambda a: np.where(a == 128, 64, a).astype(np.uint8)),
                          "mask contains values {64} outside the dofe_png encoding"),
    "fundus mask channels": ("dofe_png", _dofe_site, "test/ROIs/mask/t1.png",
                             lambda p: _rewrite_png(p, lambda a: np.concatenate([a[..., :2], 255 - a[..., 2:]], 2)),
                             "channels differ"),
    "truncated fundus image": ("dofe_png", _dofe_site, "train/ROIs/image/g1.png", _truncate, "cannot read image file"),
    "fundus shape mismatch": ("dofe_png", _dofe_site, "train/ROIs/mask/g1.png",
                              lambda p: _rewrite_png(p, lambda a: a[1:]), "shape mismatch"),
    "garbage nifti image": ("saml_nifti", _saml_site, "Case01.nii.gz",
                            lambda p: p.write_bytes(b"\x1f\x8b\x08 this is not a volume"), "cannot read image file"),
    "truncated nifti mask": ("saml_nifti", _saml_site, "Case00_segmentation.nii.gz", _truncate,
                             "cannot read mask file"),
    "nifti shape mismatch": ("saml_nifti", _saml_site, "Case01_segmentation.nii.gz",
                             lambda p: _rewrite_nifti(p, lambda a: a[:, :, :-1]), "shape mismatch"),
    "nifti negative label": ("saml_nifti", _saml_site, "Case00_segmentation.nii.gz",
                             lambda p: _rewrite_nifti(p, lambda a: a.astype(np.int16) - 1), "negative values"),
    "nifti fractional label": ("saml_nifti", _saml_site, "Case01_segmentation.nii.gz",
                               lambda p: _rewrite_nifti(p, lambda a: a.astype(np.float32) * 0.5), "non-integer"),
    "nifti nan": ("saml_nifti", _saml_site, "Case01.nii.gz",
                  lambda p: _rewrite_nifti(p, lambda a: np.where(a > 450, np.nan, a).astype(np.float32)), "NaN/Inf"),
    "nifti inf": ("saml_nifti", _saml_site, "Case00.nii.gz",
                  lambda p: _rewrite_nifti(p, lambda a: np.where(a > 450, np.inf, a).astype(np.float32)), "NaN/Inf"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_site_file_and_problem(tmp_path, fx, case):
    layout, write_site, rel, breaker, reason = BAD_INPUTS[case]
    site_dir = write_site(tmp_path, fx)
    bad = site_dir / rel
    breaker(bad)
    cfg = fx.config(tmp_path, layout, ["HK", "UCL"], unseen="UCL")
    with pytest.raises(DataError) as info:
        load_site(cfg, "HK")
    msg = str(info.value)
    assert msg.startswith("site HK: ") and info.value.site == "HK"
    assert str(bad) in msg and str(bad) in info.value.paths
    assert reason in msg


# ----------------------------------------------------------------------------------------------- root and loader


def test_no_root_uses_synthetic_generator(tmp_path, fx, monkeypatch):
    fx.make_slice_site(tmp_path, "HK", {"train": {"00": 1}})
    calls = []

    def ensure_synthetic(cfg: DataConfig) -> Path:
        calls.append(cfg)
        return tmp_path

    monkeypatch.setitem(sys.modules, "feddg.data.synthetic", types.SimpleNamespace(ensure_synthetic=ensure_synthetic))
    cfg = fx.config(tmp_path, "slice_png", ["HK", "UCL"], unseen="UCL")
    cfg.root = None
    assert len(load_site(cfg, "HK")["train"]) == 1 and calls == [cfg]


def test_make_loader_batches_and_determinism(tmp_path, fx):
    fx.make_slice_site(tmp_path, "HK", {"train": {f"{i:02d}": 2 for i in range(5)}})
    s = load_site(fx.config(tmp_path, "slice_png", ["HK", "UCL"], unseen="UCL", val_fraction=0.0), "HK")["train"]
    assert len(s) == 10
    batches = list(make_loader(s, 4, shuffle=False, augment=False, seed=0))
    assert [b["image"].shape for b in batches] == [(4, 1, 16, 16), (4, 1, 16, 16), (2, 1, 16, 16)]
    assert batches[0]["image"].dtype == batches[0]["label"].dtype == torch.float32
    assert type(batches[0]["image"]) is torch.Tensor
    assert torch.equal(batches[0]["image"], torch.from_numpy(s.images[:4]))

    def run(seed: int) -> torch.Tensor:
        return torch.cat([b["image"] for b in make_loader(s, 3, shuffle=True, augment=True, seed=seed)])

    a, b, c = run(1), run(1), run(2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    for batch in make_loader(s, 4, shuffle=True, augment=True, seed=3):
        assert set(batch["label"].unique().tolist()) <= {0.0, 1.0}
