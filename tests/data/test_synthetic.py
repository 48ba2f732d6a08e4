"""The synthetic multi-site generator: determinism, on-disk layouts, site styles, and the cache."""

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

from feddg.config import DataConfig, SyntheticConfig
from feddg.data import synthetic
from feddg.data.synthetic import (
    FUNDUS_SITES,
    FUNDUS_STYLES,
    MARKER,
    PROSTATE_SITES,
    PROSTATE_STYLES,
    ensure_synthetic,
    generate,
    prostate,
)

SMALL = SyntheticConfig(seed=3, cases_per_site=2, slices_per_case=5, size=32)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _mask_name(site: str, case: str) -> str:
    return f"{case}_Segmentation.nii.gz" if site == "BMC" else f"{case}_segmentation.nii.gz"


@pytest.fixture(scope="module")
def default_sets(tmp_path_factory) -> dict[str, Path]:
    """Both tasks at the default SyntheticConfig (the set users get), generated once for the module."""
    root = tmp_path_factory.mktemp("synthetic-default")
    return {task: generate(task, root / task, SyntheticConfig()) for task in ("prostate", "fundus")}


# ---------------------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("task", ["prostate", "fundus"])
def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path, task):
    a = _files(generate(task, tmp_path / "a", SMALL))
    b = _files(generate(task, tmp_path / "b", SMALL))
    assert a and a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []
    c = _files(generate(task, tmp_path / "c", SMALL.model_copy(update=dict(seed=4))))
    assert c.keys() == a.keys()
    images = [k for k in a if "segmentation" not in k.lower() and "/mask/" not in k]
    assert images and all(a[k] != c[k] for k in images)
    # A site's files do not depend on which other sites are generated with it.
    site = synthetic.SITES[task][2]
    d = _files(generate(task, tmp_path / "d", SMALL, sites=[site]))
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
