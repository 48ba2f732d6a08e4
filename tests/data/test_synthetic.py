"""The synthetic multi-site generator: determinism, on-disk layouts, site styles, site content and labelling
(``SyntheticConfig.shift``), and the cache."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from feddg.cli import main
from feddg.config import ConfigError, DataConfig, SyntheticConfig, config_from_dict
from feddg.folders import MARKER as FOLDER_MARKER
from feddg.data import synthetic
from feddg.data.synthetic import (
    FUNDUS_CONTENT,
    FUNDUS_SITES,
    FUNDUS_STYLES,
    MARKER,
    NEUTRAL_FUNDUS_CONTENT,
    NEUTRAL_PROSTATE_CONTENT,
    PROSTATE_CONTENT,
    PROSTATE_SITES,
    PROSTATE_STYLES,
    SHIFTS,
    ensure_synthetic,
    fundus_content,
    generate,
    prostate,
    prostate_content,
)
from feddg.data.synthetic.common import case_rng, label_rng
from tests.conftest import tiny_experiment

SMALL = SyntheticConfig(seed=3, cases_per_site=2, slices_per_case=5, size=32)


def _files(root: Path) -> dict[str, bytes]:
    """The data set's files (the marker `feddg synth` leaves in its --out is not data: feddg.folders)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != FOLDER_MARKER}


def _mask_name(site: str, case: str) -> str:
    return f"{case}_Segmentation.nii.gz" if site == "BMC" else f"{case}_segmentation.nii.gz"


@pytest.fixture(scope="module")
def default_sets(tmp_path_factory) -> dict[str, Path]:
    """Both tasks at the default SyntheticConfig (the set users get), generated once for the module."""
    root = tmp_path_factory.mktemp("synthetic-default")
    return {task: generate(task, root / task, SyntheticConfig()) for task in ("prostate", "fundus")}


# ---------------------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("task", ["prostate", "fundus"])
def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path, task, shift):
    cfg = SMALL.model_copy(update=dict(shift=shift))
    a = _files(generate(task, tmp_path / "a", cfg))
    b = _files(generate(task, tmp_path / "b", cfg))
    assert a and a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []
    c = _files(generate(task, tmp_path / "c", cfg.model_copy(update=dict(seed=4))))
    assert c.keys() == a.keys()
    images = [k for k in a if "segmentation" not in k.lower() and "/mask/" not in k]
    assert images and all(a[k] != c[k] for k in images)
    # A site's files do not depend on which other sites are generated with it.
    site = synthetic.SITES[task][2]
    d = _files(generate(task, tmp_path / "d", cfg, sites=[site]))
    assert d == {k: v for k, v in a.items() if k.startswith(site + "/")}


def test_nifti_gzip_header_carries_no_time_or_name(default_sets):
    raw = (default_sets["prostate"] / "HK" / "Case00.nii.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert raw[3] == 0  # FLG: no FNAME/FCOMMENT/FEXTRA
    assert raw[4:8] == b"\x00\x00\x00\x00"  # MTIME = 0
    assert len(gzip.decompress(raw)) > 0


# ---------------------------------------------------------------------------------------------- layouts


def test_prostate_saml_layout(default_sets):
    root, cfg = default_sets["prostate"], SyntheticConfig()
    assert sorted(p.name for p in root.iterdir()) == sorted(PROSTATE_SITES)
    spacings = set()
    for site in PROSTATE_SITES:
        cases = [f"Case{i:02d}" for i in range(cfg.cases_per_site)]
        expected = {f"{c}.nii.gz" for c in cases} | {_mask_name(site, c) for c in cases}
        assert {p.name for p in (root / site).iterdir()} == expected, site
        style = PROSTATE_STYLES[site]
        for c in cases:
            img = nib.load(root / site / f"{c}.nii.gz")
            seg = nib.load(root / site / _mask_name(site, c))
            assert img.shape == seg.shape == (cfg.size, cfg.size, cfg.slices_per_case)
            assert img.get_data_dtype() == np.dtype(style.dtype)
            assert seg.get_data_dtype() == np.uint8
            np.testing.assert_allclose(img.header.get_zooms(), style.spacing, rtol=1e-6)
            np.testing.assert_allclose(seg.affine, img.affine)
            m = np.asarray(seg.dataobj)
            assert set(np.unique(m)) == {0, 1}
            per_slice = m.reshape(-1, m.shape[2]).sum(0)
            # The gland shrinks to nothing towards apex and base: the end slices are empty.
            assert per_slice[0] == 0 and per_slice[-1] == 0 and per_slice.max() > 0, (site, c)
        spacings.add(tuple(round(float(z), 4) for z in img.header.get_zooms()))
    assert len(spacings) == len(PROSTATE_SITES)  # every site has its own voxel spacing


def test_prostate_is_neither_brightest_nor_darkest(default_sets):
    """The gland's intensity overlaps its surroundings: a threshold cannot segment it."""
    root = default_sets["prostate"]
    for site in PROSTATE_SITES:
        for i in range(3):
            v = np.asarray(nib.load(root / site / f"Case{i:02d}.nii.gz").dataobj, dtype=np.float64)
            m = np.asarray(nib.load(root / site / _mask_name(site, f"Case{i:02d}")).dataobj) > 0
            inside = v[m]
            # In-plane ring 2..6 px outside the gland.
            st = np.zeros((3, 3, 1), bool)
            st[:, 1, 0] = st[1, :, 0] = True
            ring = ndimage.binary_dilation(m, st, iterations=6) & ~ndimage.binary_dilation(m, st, iterations=2)
            lo, hi = np.percentile(v[ring], [10, 90])
            assert lo < inside.mean() < hi, (site, i)
            body = v > np.percentile(v, 30)  # drop the air around the body
            assert np.percentile(v[body], 99) > np.percentile(inside, 90), (site, i)
            assert np.percentile(v[body], 5) < np.percentile(inside, 10), (site, i)


def test_fundus_dofe_layout(default_sets):
    root, cfg = default_sets["fundus"], SyntheticConfig()
    n_train, n_test = synthetic.fundus_split(cfg.cases_per_site)
    assert (n_train, n_test) == (6, 2)
    assert sorted(p.name for p in root.iterdir()) == sorted(FUNDUS_SITES)
    cross = ndimage.generate_binary_structure(2, 1)
    for site in FUNDUS_SITES:
        for split, n in (("train", n_train), ("test", n_test)):
            images = sorted((root / site / split / "ROIs" / "image").iterdir())
            masks = sorted((root / site / split / "ROIs" / "mask").iterdir())
            assert len(images) == n and [p.name for p in images] == [p.name for p in masks]
            for ip, mp in zip(images, masks):
                img, msk = Image.open(ip), Image.open(mp)
                assert img.mode == "RGB" and img.size == (cfg.size, cfg.size)
                assert msk.mode == "RGB" and msk.size == (cfg.size, cfg.size)
                m = np.asarray(msk)
                assert (m == m[..., :1]).all()  # grey, stored as 3 channels
                m = m[..., 0]
                assert set(np.unique(m)) == {0, 128, 255}  # cup, rim, background all present
                cup, background = m == 0, m == 255
                # cup ⊂ disc with a rim all around: the cup never touches the background.
                assert not (ndimage.binary_dilation(cup, cross) & background).any(), mp


# ---------------------------------------------------------------------------------------------- site styles


def _nearest_centroid_accuracy(features: np.ndarray, labels: np.ndarray, train: np.ndarray) -> float:
    """Fit class centroids on ``train`` rows (features standardised on them), score the other rows."""
    mu, sd = features[train].mean(0), features[train].std(0) + 1e-8
    z = (features - mu) / sd
    classes = sorted(set(labels))
    centroids = np.stack([z[train & (labels == c)].mean(0) for c in classes])
    test = ~train
    dist = ((z[test][:, None, :] - centroids[None]) ** 2).sum(-1)
    predicted = np.array(classes)[dist.argmin(1)]
    return float((predicted == labels[test]).mean())


def _intensity_features(x: np.ndarray) -> np.ndarray:
    """Histogram quantiles after z-scoring (the loader's normalisation), plus noise/sharpness proxies."""
    z = (x - x.mean()) / x.std()
    q = np.percentile(z, [1, 5, 10, 25, 50, 75, 90, 95, 99])
    return np.array([*q, np.log(np.diff(z, axis=0).std()), np.log(np.diff(z, axis=1).std())])


def prostate_style_separation(root: Path, n_cases: int) -> float:
    feats, labels, case = [], [], []
    for site in PROSTATE_SITES:
        for i in range(n_cases):
            v = np.asarray(nib.load(root / site / f"Case{i:02d}.nii.gz").dataobj, dtype=np.float64)
            feats.append(_intensity_features(v))
            labels.append(site)
            case.append(i)
    return _nearest_centroid_accuracy(np.array(feats), np.array(labels), np.array(case) < n_cases // 2)


def fundus_style_separation(root: Path) -> float:
    feats, labels, is_train = [], [], []
    for site in FUNDUS_SITES:
        for split in ("train", "test"):
            for p in sorted((root / site / split / "ROIs" / "image").iterdir()):
                a = np.asarray(Image.open(p), dtype=np.float64) / 255.0
                colour = a.reshape(-1, 3)
                feats.append(np.concatenate([colour.mean(0), colour.std(0), _intensity_features(a)]))
                labels.append(site)
                is_train.append(split == "train")
    return _nearest_centroid_accuracy(np.array(feats), np.array(labels), np.array(is_train))


def test_sites_are_identifiable_from_intensity_statistics(default_sets):
    # Chance is 1/6 (prostate) and 1/4 (fundus); held-out cases are classified from centroids of
    # the other cases of each site (prostate: cases 0-3 fit, 4-7 scored; fundus: train fit, test scored).
    acc_p = prostate_style_separation(default_sets["prostate"], SyntheticConfig().cases_per_site)
    acc_f = fundus_style_separation(default_sets["fundus"])
    assert acc_p >= 0.8, acc_p
    assert acc_f >= 0.8, acc_f


def test_style_tables_cover_the_sites():
    assert tuple(PROSTATE_STYLES) == PROSTATE_SITES and tuple(FUNDUS_STYLES) == FUNDUS_SITES
    for style in PROSTATE_STYLES.values():
        assert 0.4 <= style.spacing[0] <= 0.8 and 3.0 <= style.spacing[2] <= 4.0


# ---------------------------------------------------------------------------------------------- site content


# Large enough for per-site means to be stable (16 volumes, 48 images per site), small enough to be quick (48 px).
SHIFT_PROSTATE = SyntheticConfig(seed=1, cases_per_site=16, slices_per_case=12, size=48)
SHIFT_FUNDUS = SyntheticConfig(seed=1, cases_per_site=48, size=48)


@pytest.fixture(scope="module")
def shift_sets(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(task, shift) -> a generated set at SHIFT_PROSTATE / SHIFT_FUNDUS, for both values of ``shift``."""
    root = tmp_path_factory.mktemp("synthetic-shift")
    sets = {}
    for shift in SHIFTS:
        for task, cfg in (("prostate", SHIFT_PROSTATE), ("fundus", SHIFT_FUNDUS)):
            sets[task, shift] = generate(task, root / shift / task, cfg.model_copy(update=dict(shift=shift)))
    return sets


def _prostate_mask(root: Path, site: str, case: int) -> np.ndarray:
    """``(H, W, S)`` uint8 mask of one volume."""
    return np.asarray(nib.load(root / site / _mask_name(site, f"Case{case:02d}")).dataobj)


def prostate_gland_area(root: Path, cfg: SyntheticConfig, site: str) -> float:
    """Mean labelled voxels per volume in anatomy units: divided by the style's zoom squared and the image scale
    squared, so that the field of view (a style) does not count as a content difference."""
    per_px = (PROSTATE_STYLES[site].zoom * cfg.size / 96.0) ** 2
    return float(np.mean([_prostate_mask(root, site, i).sum() / per_px for i in range(cfg.cases_per_site)]))


def prostate_unlabelled_gland_slices(root: Path, cfg: SyntheticConfig, site: str) -> list[np.ndarray]:
    """Per volume, the slice positions along the gland (``rel_z``: -1 apex end, +1 base end) of the slices that cut
    the imaged gland but carry no label. The geometry is redrawn from the case's generator; the redrawn mask must
    be the file's (so the test measures what is written)."""
    style, content = PROSTATE_STYLES[site], prostate_content(site, cfg.shift)
    site_index = PROSTATE_SITES.index(site)
    out = []
    for i in range(cfg.cases_per_site):
        _, geometry = prostate._prostate_anatomy(case_rng(cfg.seed, "prostate", site_index, i), cfg.size,
                                                 cfg.slices_per_case, style, content)
        mask = prostate._annotate_prostate(geometry, content, label_rng(cfg.seed, "prostate", site_index, i))
        np.testing.assert_array_equal(mask, _prostate_mask(root, site, i))
        visible = ((geometry.q <= 1.0) & geometry.present).any(axis=(0, 1))  # (S,) the image shows gland
        labelled = mask.any(axis=(0, 1))
        out.append(geometry.rel_z[visible & ~labelled])
    return out


def fundus_masks(root: Path, site: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(disc, cup) bool ``(H, W)`` of every image of a domain, train and test."""
    out = []
    for p in sorted(root.glob(f"{site}/*/ROIs/mask/*.png")):
        m = np.asarray(Image.open(p))[..., 0]
        out.append((m < 255, m == 0))
    return out


def fundus_content_stats(root: Path, cfg: SyntheticConfig, site: str) -> dict[str, float]:
    """Mean labelled cup/disc area ratio, disc area in anatomy units (over the style's zoom squared and the image
    scale squared) and disc height/width of a domain."""
    per_px = (FUNDUS_STYLES[site].zoom * cfg.size / 96.0) ** 2
    ratio, area, aspect = [], [], []
    for disc, cup in fundus_masks(root, site):
        ratio.append(cup.sum() / disc.sum())
        area.append(disc.sum() / per_px)
        rows, cols = np.flatnonzero(disc.any(1)), np.flatnonzero(disc.any(0))
        aspect.append((rows[-1] - rows[0] + 1) / (cols[-1] - cols[0] + 1))
    return {"cup_disc": float(np.mean(ratio)), "disc_area": float(np.mean(area)), "aspect": float(np.mean(aspect))}


def test_content_tables_cover_the_sites_and_style_only_is_neutral():
    assert tuple(PROSTATE_CONTENT) == PROSTATE_SITES and tuple(FUNDUS_CONTENT) == FUNDUS_SITES
    for site in PROSTATE_SITES:
        assert prostate_content(site, "style_only") is NEUTRAL_PROSTATE_CONTENT
        assert prostate_content(site, "style_and_content") is PROSTATE_CONTENT[site]
    for site in FUNDUS_SITES:
        assert fundus_content(site, "style_only") is NEUTRAL_FUNDUS_CONTENT
        assert fundus_content(site, "style_and_content") is FUNDUS_CONTENT[site]
    # Every site has its own entry, none of them the neutral one (RUNMC shares its anatomy but not its labelling).
    assert len(set(PROSTATE_CONTENT.values()) - {NEUTRAL_PROSTATE_CONTENT}) == len(PROSTATE_SITES)
    assert len(set(FUNDUS_CONTENT.values()) - {NEUTRAL_FUNDUS_CONTENT}) == len(FUNDUS_SITES)
    with pytest.raises(AttributeError):  # frozen: a table entry cannot be changed in place
        PROSTATE_CONTENT["HK"].gland_scale = 2.0  # type: ignore[misc]


def test_prostate_gland_size_differs_by_site_as_documented(shift_sets):
    root = shift_sets["prostate", "style_and_content"]
    area = {site: prostate_gland_area(root, SHIFT_PROSTATE, site) for site in PROSTATE_SITES}
    # BIDMC: large gland (x1.12) labelled generously (+1 px); HK: small gland (x0.88) labelled on its outline.
    # Expected area ratio (1.12 / 0.88)^2 = 1.6 before the margin; measured about 2.
    assert area["BIDMC"] > 1.6 * area["HK"], area
    # The small-gland sites (HK, I2CVB) label less than the large-gland one with a margin (BIDMC).
    assert max(area["HK"], area["I2CVB"]) < area["BIDMC"], area


def test_prostate_apex_and_base_labelling_differs_by_site_as_documented(shift_sets):
    root = shift_sets["prostate", "style_and_content"]
    unlabelled = {site: prostate_unlabelled_gland_slices(root, SHIFT_PROSTATE, site) for site in PROSTATE_SITES}
    per_volume = {site: np.mean([len(r) for r in rel]) for site, rel in unlabelled.items()}
    # BIDMC and RUNMC label every slice that shows gland; BMC (apex and base), HK (apex) and I2CVB (base) do not.
    assert per_volume["BIDMC"] == per_volume["RUNMC"] == 0, per_volume
    for site in ("BMC", "HK", "I2CVB"):
        assert per_volume[site] >= 0.4, per_volume
    # HK leaves out apex slices only, I2CVB base slices only, BMC both ends.
    assert all((r < 0).all() for r in unlabelled["HK"]) and all((r > 0).all() for r in unlabelled["I2CVB"])
    bmc = np.concatenate(unlabelled["BMC"])
    assert (bmc < 0).any() and (bmc > 0).any()
    # Whatever the convention, the slice through the gland's centre stays labelled: no volume is left empty.
    assert all(_prostate_mask(root, site, i).any() for site in PROSTATE_SITES
               for i in range(SHIFT_PROSTATE.cases_per_site))


def test_fundus_disc_and_cup_differ_by_domain_as_documented(shift_sets):
    root = shift_sets["fundus", "style_and_content"]
    stats = {site: fundus_content_stats(root, SHIFT_FUNDUS, site) for site in FUNDUS_SITES}
    ratio = {site: s["cup_disc"] for site, s in stats.items()}
    # Documented order of the labelled cup-to-disc area ratio: Domain4 < Domain3 < Domain2 < Domain1 (expected
    # about 0.22, 0.26, 0.31, 0.39; the order held for seeds 0-5 at 24 and at 48 images per domain).
    assert ratio["Domain4"] < ratio["Domain3"] < ratio["Domain2"] < ratio["Domain1"], ratio
    assert ratio["Domain1"] > 1.4 * ratio["Domain4"], ratio
    # Disc size x1.05 drawn with a +1 px margin (Domain4) against x0.96 on the outline (Domain3): area ratio about
    # 1.3 expected.
    assert stats["Domain4"]["disc_area"] > 1.15 * stats["Domain3"]["disc_area"], stats
    # Shape: Domain4's discs are the most vertically oval (1.16), Domain2's nearly round (1.03).
    assert stats["Domain4"]["aspect"] > stats["Domain2"]["aspect"] + 0.07, stats


def test_style_only_gives_every_site_the_same_content_while_styles_still_differ(shift_sets):
    root = shift_sets["prostate", "style_only"]
    area = {site: prostate_gland_area(root, SHIFT_PROSTATE, site) for site in PROSTATE_SITES}
    pooled = np.mean(list(area.values()))
    # Per-site means of 16 volumes scatter by about 5 % (at most 10 % from the pooled mean over seeds 0-4): 15 % is
    # a wide margin, while under style_and_content BIDMC labels about twice HK's area.
    assert all(abs(a / pooled - 1) < 0.15 for a in area.values()), area
    cfg = SHIFT_PROSTATE.model_copy(update=dict(shift="style_only"))
    for site in PROSTATE_SITES:
        assert all(len(r) == 0 for r in prostate_unlabelled_gland_slices(root, cfg, site)), site
    ratio = {site: fundus_content_stats(shift_sets["fundus", "style_only"], SHIFT_FUNDUS, site)["cup_disc"]
             for site in FUNDUS_SITES}
    pooled = np.mean(list(ratio.values()))
    assert all(abs(r / pooled - 1) < 0.15 for r in ratio.values()), ratio
    # The styles are those of style_and_content: the sites stay identifiable from intensity statistics.
    assert prostate_style_separation(root, SHIFT_PROSTATE.cases_per_site) >= 0.8
    assert fundus_style_separation(shift_sets["fundus", "style_only"]) >= 0.8


def test_the_labelling_convention_never_changes_the_image(shift_sets):
    # RUNMC's anatomy is the neutral one; only its labelling differs between the variants (light smoothing): its
    # images are the same bytes in both. A site with its own anatomy (BIDMC) images other glands.
    with_content, style_only = shift_sets["prostate", "style_and_content"], shift_sets["prostate", "style_only"]
    for i in range(SHIFT_PROSTATE.cases_per_site):
        name = f"Case{i:02d}.nii.gz"
        assert (with_content / "RUNMC" / name).read_bytes() == (style_only / "RUNMC" / name).read_bytes()
        assert (with_content / "BIDMC" / name).read_bytes() != (style_only / "BIDMC" / name).read_bytes()


def test_shift_is_part_of_the_schema_the_cache_key_and_the_synth_command(tmp_path, capsys):
    exp = tiny_experiment("prostate")
    exp["data"]["synthetic"]["shift"] = "style_only"
    assert config_from_dict(exp).data.synthetic.shift == "style_only"
    exp["data"]["synthetic"]["shift"] = "content_only"
    with pytest.raises(ConfigError, match=r"data\.synthetic\.shift"):
        config_from_dict(exp)
    assert SyntheticConfig().shift == "style_and_content"
    # A config copied with an unchecked value is refused by the generator itself.
    with pytest.raises(ValueError, match="synthetic.shift"):
        generate("prostate", tmp_path / "bad", SMALL.model_copy(update=dict(shift="content_only")))
    only = SMALL.model_copy(update=dict(shift="style_only"))
    assert synthetic.cache_key("prostate", SMALL, ["HK"]) != synthetic.cache_key("prostate", only, ["HK"])
    # `feddg synth --shift` writes what generate() writes for that config.
    argv = ["synth", "--task", "prostate", "--out", str(tmp_path / "cli"), "--sites", "HK", "--seed", "3",
            "--cases-per-site", "2", "--slices-per-case", "5", "--size", "32", "--shift", "style_only"]
    assert main(argv) == 0
    assert _files(tmp_path / "cli") == _files(generate("prostate", tmp_path / "direct", only, ["HK"]))
    assert _files(tmp_path / "cli") != _files(generate("prostate", tmp_path / "content", SMALL, ["HK"]))
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------- errors


def test_generate_rejects_unknown_task_sites_and_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        generate("liver", tmp_path, SMALL)
    with pytest.raises(ValueError, match=r"\['Mars'\]"):
        generate("prostate", tmp_path, SMALL, sites=["BIDMC", "Mars"])
    with pytest.raises(ValueError, match="Domain9"):
        generate("fundus", tmp_path, SMALL, sites=["Domain9"])
    with pytest.raises(ValueError, match="cases_per_site"):
        generate("fundus", tmp_path, SMALL.model_copy(update=dict(cases_per_site=1)))
    with pytest.raises(ValueError, match="size"):
        generate("prostate", tmp_path, SMALL.model_copy(update=dict(size=8)))


def test_ensure_synthetic_checks_layout_and_sites(tmp_path):
    with pytest.raises(ValueError, match="saml_nifti"):
        ensure_synthetic(DataConfig(task="prostate", layout="slice_png", cache_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="dofe_png"):
        ensure_synthetic(DataConfig(task="fundus", layout="saml_nifti", sites=["Domain1"], cache_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"\['Mars', 'Venus'\]"):
        ensure_synthetic(DataConfig(sites=["BIDMC", "Mars", "Venus"], unseen_site="BIDMC", cache_dir=str(tmp_path)))
    assert not (tmp_path / "synthetic").exists() or not any((tmp_path / "synthetic").iterdir())


# ---------------------------------------------------------------------------------------------- cache


def _data_cfg(cache: Path, **synth) -> DataConfig:
    return DataConfig(
        sites=["BIDMC", "BMC", "HK"],
        unseen_site="HK",
        cache_dir=str(cache),
        synthetic=SMALL.model_copy(update=dict(**synth)),
    )


def _cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "synthetic").iterdir() if p.is_dir())


def test_ensure_synthetic_generates_once_then_reuses(tmp_path, monkeypatch):
    calls = []
    real = synthetic.generate
    monkeypatch.setattr(synthetic, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = _data_cfg(tmp_path)
    root = ensure_synthetic(cfg)
    assert root.parent == tmp_path / "synthetic" and root.name.startswith("prostate-")
    assert json.loads((root / MARKER).read_text())["sites"] == ["BIDMC", "BMC", "HK"]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["BIDMC", "BMC", "HK"]
    stamp = (root / "BIDMC" / "Case00.nii.gz").stat().st_mtime_ns
    assert ensure_synthetic(cfg) == root and len(calls) == 1
    assert (root / "BIDMC" / "Case00.nii.gz").stat().st_mtime_ns == stamp
    # Same content as a direct generate() of those sites.
    direct = _files(real("prostate", tmp_path / "direct", cfg.synthetic, ["BIDMC", "BMC", "HK"]))
    assert {k: v for k, v in _files(root).items() if k != MARKER} == direct
    # Site order does not matter; another seed or site list is another folder.
    reordered = cfg.model_copy(update=dict(sites=["HK", "BIDMC", "BMC"]))
    assert ensure_synthetic(reordered) == root and len(calls) == 1
    other = ensure_synthetic(_data_cfg(tmp_path, seed=5))
    assert other != root and len(calls) == 2
    assert _cache_entries(tmp_path) == sorted([root.name, other.name])


def test_ensure_synthetic_threads_share_one_generation(tmp_path, monkeypatch):
    calls, guard = [], threading.Lock()
    real = synthetic.generate

    def slow_generate(*a, **k):
        with guard:
            calls.append(1)
        time.sleep(0.3)  # keep the others waiting on the lock
        return real(*a, **k)

    monkeypatch.setattr(synthetic, "generate", slow_generate)
    cfg, results = _data_cfg(tmp_path), []
    threads = [threading.Thread(target=lambda: results.append(ensure_synthetic(cfg))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and len(set(results)) == 1 and len(calls) == 1
    assert _cache_entries(tmp_path) == [results[0].name]  # no temporary folder left


_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from feddg.config import DataConfig, SyntheticConfig
    from feddg.data import synthetic
    calls = []
    real = synthetic.generate
    def slow(*a, **k):
        calls.append(1)
        time.sleep(0.5)  # widen the race window
        return real(*a, **k)
    synthetic.generate = slow
    cfg = DataConfig(sites=["BIDMC", "BMC", "HK"], unseen_site="HK", cache_dir=sys.argv[1],
                     synthetic=SyntheticConfig(**json.loads(sys.argv[2])))
    root = synthetic.ensure_synthetic(cfg)
    print(json.dumps({"root": str(root), "calls": len(calls)}))
    """
)


def test_ensure_synthetic_concurrent_processes(tmp_path):
    args = [sys.executable, "-c", _WORKER, str(tmp_path), json.dumps(SMALL.model_dump())]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    roots = {o["root"] for o in outs}
    assert len(roots) == 1 and sum(o["calls"] for o in outs) == 1
    root = Path(roots.pop())
    assert _cache_entries(tmp_path) == [root.name]  # one folder, no temporary leftovers
    direct = _files(generate("prostate", tmp_path / "direct", SMALL, ["BIDMC", "BMC", "HK"]))
    assert {k: v for k, v in _files(root).items() if k != MARKER} == direct


def test_failed_generation_leaves_no_cache_folder(tmp_path, monkeypatch):
    written = []
    real_write = prostate._write_nifti

    def failing_write(*a, **k):
        if len(written) == 3:
            raise RuntimeError("disk full (simulated)")
        written.append(1)
        return real_write(*a, **k)

    monkeypatch.setattr(prostate, "_write_nifti", failing_write)
    cfg = _data_cfg(tmp_path)
    with pytest.raises(RuntimeError, match="simulated"):
        ensure_synthetic(cfg)
    assert len(written) == 3  # it did fail midway, after writing some files
    assert _cache_entries(tmp_path) == []  # neither the final nor the temporary folder
    monkeypatch.setattr(prostate, "_write_nifti", real_write)
    root = ensure_synthetic(cfg)
    assert (root / MARKER).is_file() and _cache_entries(tmp_path) == [root.name]


def test_leftovers_of_a_killed_run_are_replaced(tmp_path):
    cfg = _data_cfg(tmp_path)
    key = synthetic.cache_key("prostate", cfg.synthetic, cfg.sites)
    parent = tmp_path / "synthetic"
    stale_tmp = parent / f".prostate-{key}.tmp-dead"
    (stale_tmp / "BIDMC").mkdir(parents=True)
    half = parent / f"prostate-{key}"  # a folder without its marker: never trusted
    (half / "BIDMC").mkdir(parents=True)
    (half / "BIDMC" / "junk.txt").write_text("x")
    root = ensure_synthetic(cfg)
    assert root == half and (root / MARKER).is_file() and not (root / "BIDMC" / "junk.txt").exists()
    assert _cache_entries(tmp_path) == [root.name]


def test_the_held_out_site_gets_its_own_number_of_cases_and_the_others_do_not_change(tmp_path):
    more = SMALL.model_copy(update={"held_out_cases": 4})
    plain = synthetic.generate("prostate", tmp_path / "plain", SMALL, ["BMC", "HK"])
    extra = synthetic.generate("prostate", tmp_path / "extra", more, ["BMC", "HK"], held_out="HK")
    assert len(list((extra / "HK").glob("Case??.nii.gz"))) == 4 and len(list((extra / "BMC").glob("Case??.nii.gz"))) == 2
    a, b = _files(plain), _files(extra)
    assert {k: v for k, v in a.items()} == {k: v for k, v in b.items() if k in a}, "case i must not depend on the count"
    assert synthetic.cache_key("prostate", SMALL, ["BMC", "HK"]) != synthetic.cache_key("prostate", more, ["BMC", "HK"],
                                                                                       "HK")
    assert synthetic.cache_key("prostate", more, ["BMC", "HK"], "HK") != synthetic.cache_key("prostate", more,
                                                                                           ["BMC", "HK"], "BMC")
    fundus = synthetic.generate("fundus", tmp_path / "fundus", SMALL.model_copy(update={"held_out_cases": 8}),
                                ["Domain1", "Domain2"], held_out="Domain1")
    assert len(list((fundus / "Domain1").rglob("image/*.png"))) == 8
    assert len(list((fundus / "Domain2").rglob("image/*.png"))) == 2
