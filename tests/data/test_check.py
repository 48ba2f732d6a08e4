"""check_data: read-only, exhaustive reports."""

from __future__ import annotations

import numpy as np
import pytest

from feddg.data.check import check_data, describe_shapes, format_report, main


def test_real_prostate_slices_report_the_unpaired_file(samples, fx):
    root = samples / "ProstateSlice"
    before = fx.tree_hash(root)
    report = check_data("slice_png", root)
    assert fx.tree_hash(root) == before
    assert report["ok"] is False and report["task"] == "prostate"
    assert list(report["sites"]) == fx.PROSTATE_SITES
    (problem,) = report["problems"]
    assert problem.startswith("site I2CVB: ") and "00_01.png" in problem and "00_00.png" in problem
    i2cvb = report["sites"]["I2CVB"]
    assert i2cvb["problems"] == [problem]
    assert i2cvb["splits"] == {"test": {"images": 1, "cases": 1, "slices": 1}}  # the paired test image is checked
    bidmc = report["sites"]["BIDMC"]
    assert bidmc["problems"] == [] and bidmc["image_shapes"] == [(384, 384)]
    one = {"images": 1, "cases": 1, "slices": 1}
    assert bidmc["splits"] == {"train": one, "test": one}
    assert bidmc["labels"]["prostate"]["with_foreground"] == 1.0
    assert 0 < bidmc["labels"]["prostate"]["mean_fraction"] < 0.1
    it = bidmc["intensity"]
    assert 0 <= it["min"] <= it["mean"] <= it["max"] <= 255 and it["std"] > 0
    text = format_report(report)
    assert "I2CVB" in text and "00_01.png" in text and "1 problem(s)" in text and "384x384" in text


def test_real_fundus_is_ok(samples, fx):
    root = samples / "Fundus"
    before = fx.tree_hash(root)
    report = check_data("dofe_png", root, task="fundus")
    assert fx.tree_hash(root) == before
    assert report["ok"] is True and report["problems"] == []
    assert list(report["sites"]) == fx.FUNDUS_SITES
    for r in report["sites"].values():
        assert r["image_shapes"] == [(800, 800, 3)]
        assert r["labels"]["disc"]["with_foreground"] == r["labels"]["cup"]["with_foreground"] == 1.0
        assert r["labels"]["disc"]["mean_fraction"] > r["labels"]["cup"]["mean_fraction"] > 0
    assert "no problems found" in format_report(report)


def test_collects_every_problem_and_modifies_nothing(tmp_path, fx):
    fx.make_slice_site(tmp_path, "HK", {"train": {"00": 3, "01": 2}, "test": {"07": 2}})
    fx.make_slice_site(tmp_path, "UCL", {"train": {"00": 2}, "test": {"05": 1}})
    hk = tmp_path / "HK"
    (hk / "train" / "mask" / "01_01.png").unlink()  # unpaired
    data = (hk / "train" / "image" / "00_02.png").read_bytes()
    (hk / "train" / "image" / "00_02.png").write_bytes(data[: len(data) // 3])  # truncated
    fx.write_png(hk / "test" / "mask" / "07_00.png", np.full((40, 32), 100, np.uint8))  # outside the encoding
    fx.write_png(hk / "test" / "mask" / "07_01.png", np.full((40, 30), 255, np.uint8))  # shape mismatch
    before = fx.tree_hash(tmp_path)
    report = check_data("slice_png", tmp_path, task="prostate")
    assert fx.tree_hash(tmp_path) == before
    assert report["ok"] is False and report["sites"]["UCL"]["problems"] == []
    problems = report["sites"]["HK"]["problems"]
    assert len(problems) == 4 and report["problems"] == problems
    joined = "\n".join(problems)
    for needle in ("01_01.png: unpaired", "00_02.png: cannot read image file", "07_00.png: mask contains values {100}",
                   "shape mismatch"):
        assert needle in joined
    assert all(p.startswith("site HK: ") for p in problems)
    splits = report["sites"]["HK"]["splits"]
    assert splits["train"] == {"images": 4, "cases": 2, "slices": 3}  # 4 pairs, 1 unreadable
    assert splits["test"] == {"images": 2, "cases": 1, "slices": 0}


def test_nifti_counts_slices_and_volumes(tmp_path, fx):
    fx.make_saml_site(tmp_path, "BMC", 3, seg="Segmentation", shape=(24, 20, 6), fg_slices=(2, 3, 4))
    report = check_data("saml_nifti", tmp_path)
    assert report["ok"] is True and report["task"] == "prostate"
    r = report["sites"]["BMC"]
    assert r["splits"] == {"all": {"images": 3, "cases": 3, "slices": 18}}
    assert r["image_shapes"] == [(24, 20, 6)]
    assert r["labels"]["prostate"]["with_foreground"] == pytest.approx(0.5)
    assert r["intensity"]["mean"] == pytest.approx(300 + 200 * 0.25 * 0.5, rel=0.05)


def test_missing_site_wrong_task_and_unknown_layout(tmp_path, fx):
    fx.make_dofe_site(tmp_path, "Domain1", {"train": ["a"], "test": ["b"]})
    report = check_data("dofe_png", tmp_path, sites=["Domain1", "Domain7"], task="prostate")
    assert report["ok"] is False and len(report["problems"]) == 2
    assert "holds fundus data, not 'prostate'" in report["problems"][0]
    assert report["problems"][1].startswith("site Domain7: ") and "site folder is missing" in report["problems"][1]
    assert report["sites"]["Domain1"]["problems"] == []
    format_report(report)
    bad = check_data("png", tmp_path)
    assert bad["ok"] is False and "unknown data layout 'png'" in bad["problems"][0]
    empty = check_data("slice_png", tmp_path / "nothing")
    assert empty["ok"] is False and "does not exist" in empty["problems"][0]


def test_cli_exit_status(tmp_path, fx, capsys):
    fx.make_dofe_site(tmp_path, "Domain1", {"train": ["a"], "test": ["b"]})
    assert main(["dofe_png", str(tmp_path)]) == 0
    assert "Domain1" in capsys.readouterr().out
    (tmp_path / "Domain1" / "test" / "ROIs" / "mask" / "b.png").unlink()
    assert main(["dofe_png", str(tmp_path)]) == 1
    assert "b.png" in capsys.readouterr().out


def test_each_split_shows_its_own_statistics_and_many_image_sizes_are_summarised(tmp_path, fx):
    fx.make_slice_site(tmp_path, "HK", {"train": {"00": 2}})
    for i, size in enumerate([(50, 36), (60, 44), (70, 52), (80, 60)]):
        mask = np.full(size, 255, np.uint8)
        mask[5:20, 5:20] = 0  # the prostate
        fx.write_png(tmp_path / "HK" / "test" / "image" / f"09_{i:02d}.png", np.full(size, 7, np.uint8))
        fx.write_png(tmp_path / "HK" / "test" / "mask" / f"09_{i:02d}.png", mask)
    report = check_data("slice_png", tmp_path)
    hk = report["sites"]["HK"]
    assert hk["split_statistics"]["test"]["intensity"] == {"min": 7.0, "max": 7.0, "mean": 7.0, "std": 0.0}
    assert hk["split_statistics"]["train"]["image_shapes"] == [(40, 32)] and len(hk["image_shapes"]) == 5
    assert hk["split_statistics"]["test"]["labels"]["prostate"]["with_foreground"] == 1.0
    rows = {line.split()[1] if line.startswith("HK") else line.split()[0]: line
            for line in format_report(report).splitlines() if line.startswith(("HK", " "))}
    assert "40x32" in rows["train"] and "sizes" not in rows["train"] and " 7 " not in rows["train"]
    assert "4 sizes from 50x36 to 80x60" in rows["test"] and rows["test"].split()[10:14] == ["7", "7", "7", "0"]
    assert describe_shapes([(800, 800, 3), (128, 128, 3)]) == "128x128x3, 800x800x3" and describe_shapes([]) == "-"


@pytest.mark.parametrize("layout, make, missing", [
    ("slice_png", lambda fx, root: fx.make_slice_site(root, "HK", {"train": {"00": 2}}), "test"),
    ("slice_png", lambda fx, root: fx.make_slice_site(root, "HK", {"test": {"00": 2}}), "train"),
    ("dofe_png", lambda fx, root: fx.make_dofe_site(root, "HK", {"train": ["a", "b"]}), "test"),
])
def test_a_site_without_a_split_the_task_needs_is_a_problem(tmp_path, fx, layout, make, missing):
    """check-data said "no problems found" for a site without test/, which docs/real-data.md lists as a problem."""
    make(fx, tmp_path)
    report = check_data(layout, tmp_path)
    assert report["ok"] is False
    (problem,) = report["problems"]
    assert problem.startswith("site HK: ") and f"no {missing}/ folder" in problem
    assert "no problems found" not in format_report(report)
