"""benchmarks/mask_volume.py: the volume split on hand-worked masks, and a results folder whose runs keep their
models (scored again, checked against their records, paired by seed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.mask_volume import case_volumes, main, measure, summarise
from tests.conftest import REPOSITORY, tiny_experiment
from tests.test_inference import save_checkpoint

PROSTATE = REPOSITORY / "benchmarks" / "results" / "loso_prostate_seeds"
TEMPLATE = PROSTATE / "runs" / "prostate_ga_HK_seed0" / "run.json"


def test_case_volumes_split_the_prediction_by_the_reference_slices():
    gt = np.zeros((4, 4, 3), bool)
    gt[1:3, 1:3, :2] = True  # 8 voxels on slices 0 and 1; slice 2 left unlabelled
    pred = np.zeros_like(gt)
    pred[1:3, 1:3, 0] = True  # 4 on slice 0
    pred[0:3, 0:3, 1] = True  # 9 on slice 1 (over-segmented in-plane)
    pred[0, 0:2, 2] = True  # 2 on the unlabelled slice
    assert case_volumes(pred, gt) == pytest.approx({"ratio": 15 / 8, "in_slices": 13 / 8, "off_slices": 2 / 8})
    image_gt, image_pred = gt[..., 0], pred[..., 0].copy()
    image_pred[1, 1] = False  # an image is one slice: 3 of the reference's 4 pixels
    assert case_volumes(image_pred, image_gt) == pytest.approx({"ratio": 0.75, "in_slices": 0.75, "off_slices": 0.0})
    assert case_volumes(pred, np.zeros_like(gt)) is None  # no reference size to compare with
    with pytest.raises(ValueError, match="one shape"):
        case_volumes(pred, gt[..., :2])


def _run(folder: Path, root: Path, method: str, seed: int, keep_model: bool = True) -> dict:
    """A finished run of the held-out site HK whose record holds the per-case Dice its model scores (as a sweep's
    run.json does), with its model where the local executor keeps it."""
    from feddg.data.dataset import load_site
    from feddg.evaluation import evaluate_sliceset
    from feddg.experiment import experiment_from_dict
    from feddg.nets.unet import build_model

    exp = tiny_experiment("prostate", root=str(root))
    exp["data"]["unseen_site"] = "HK"
    cfg = experiment_from_dict(exp)
    torch.manual_seed(seed * 10 + len(method))
    model = build_model(cfg).eval()
    run_id = f"prostate_{method}_HK_seed{seed}"
    run_folder = folder / "runs" / run_id
    model_path = run_folder / "ws" / "server" / "simulate_job" / "app_server" / "FL_global_model.pt"
    model_path.parent.mkdir(parents=True)
    if keep_model:
        save_checkpoint(model_path, exp, state=dict(model.state_dict()))
    result = evaluate_sliceset(model, load_site(cfg.data, "HK")["test"], cfg.data.label_names, torch.device("cpu"))
    summary = {**result["summary"], "cases": {str(i): {"prostate": {"dice": c["0"]["dice"]}}
                                              for i, c in enumerate(result["cases"])}}
    record = copy.deepcopy(json.loads(TEMPLATE.read_text()))
    record["run"].update(method=method, held_out="HK", seed=seed)
    record["config"] = exp
    record["report"]["models"] = {"final": {"sites": {"HK": {"role": "unseen", "splits": {"test": summary}}}}}
    record["report"]["reported_model"] = "final"
    (run_folder / "run.json").write_text(json.dumps(record))
    return record


def test_measure_scores_each_kept_model_again_and_checks_it_against_its_record(tmp_path, synthetic_root):
    from feddg.data.dataset import load_site
    from feddg.evaluation import predict_logits
    from feddg.inference import read_checkpoint

    folder = tmp_path / "results"
    for method in ("uniform", "ga"):
        _run(folder, synthetic_root["prostate"], method, 0)
    _run(folder, synthetic_root["prostate"], "ga", 1, keep_model=False)
    _run(folder, synthetic_root["prostate"], "fedavg", 0)  # its model kept beside run.json, not in ws
    fedavg_folder = folder / "runs" / "prostate_fedavg_HK_seed0"
    (fedavg_folder / "ws" / "server" / "simulate_job" / "app_server" / "FL_global_model.pt").rename(
        fedavg_folder / "FL_global_model.pt")
    record = json.loads((folder / "runs" / "prostate_ga_HK_seed0" / "run.json").read_text())
    record["report"]["models"]["final"]["sites"]["HK"]["splits"]["test"]["cases"]["0"]["prostate"]["dice"] += 0.25
    (folder / "runs" / "prostate_ga_HK_seed0" / "run.json").write_text(json.dumps(record))
    # MLA-BIN reports its attention-combined model: the final global model is checked against its own scores.
    mla = _run(folder, synthetic_root["prostate"], "mlabin", 0)
    combined = copy.deepcopy(mla["report"]["models"]["final"])
    combined["sites"]["HK"]["splits"]["test"]["cases"]["0"]["prostate"]["dice"] += 0.25
    mla["report"].update(models={**mla["report"]["models"], "mla": combined}, reported_model="mla")
    (folder / "runs" / "prostate_mlabin_HK_seed0" / "run.json").write_text(json.dumps(mla))

    rows, missing = measure(folder)
    assert missing == ["prostate_ga_HK_seed1"]
    by_method = {r["method"]: r for r in rows}
    assert by_method["uniform"]["max_dice_difference"] == pytest.approx(0.0, abs=1e-7)  # the model its run scored
    assert by_method["fedavg"]["model"] == str(fedavg_folder / "FL_global_model.pt")
    assert by_method["fedavg"]["max_dice_difference"] == pytest.approx(0.0, abs=1e-7)
    assert by_method["ga"]["max_dice_difference"] == pytest.approx(0.25, abs=1e-6)  # the record says otherwise
    assert by_method["mlabin"]["max_dice_difference"] == pytest.approx(0.0, abs=1e-7)

    # The ratio against a count over each case's slices, done here without the per-slice split.
    ga = by_method["ga"]
    checkpoint = read_checkpoint(Path(ga["model"]))
    test = load_site(checkpoint.config.data, "HK")["test"]
    pred = predict_logits(checkpoint.model, test.images, torch.device("cpu")) > 0
    expected = [pred[rows].sum() / test.labels[rows].sum() for rows in test.case_indices().values()]
    assert [c["ratio"] for c in ga["cases"]] == pytest.approx(expected)
    assert all(c["ratio"] == pytest.approx(c["in_slices"] + c["off_slices"]) for c in ga["cases"])

    cells = {s["method"]: s for s in summarise(rows, "uniform")}
    uniform_cell, ga_cell = cells["uniform"], cells["ga"]
    assert uniform_cell["ratio_minus_control"] is None
    assert ga_cell["ratio_minus_control"]["mean"] == pytest.approx(ga["ratio"] - by_method["uniform"]["ratio"])
    assert ga_cell["ratio_minus_control"]["n_seeds"] == 1 and ga_cell["ratio_minus_control"]["low"] is None


def test_the_command_writes_its_tables_and_refuses_what_it_cannot_score(tmp_path, synthetic_root):
    folder = tmp_path / "results"
    _run(folder, synthetic_root["prostate"], "uniform", 0)
    assert main([str(folder)]) == 2  # no sweep.json: not a results folder
    (folder / "sweep.json").write_text((PROSTATE / "sweep.json").read_text())
    assert main([str(folder), "--held-out", "BMC"]) == 1  # no run held out at BMC
    assert main([str(folder), "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "mask_volume.json").read_text())
    assert [r["run_id"] for r in saved["runs"]] == ["prostate_uniform_HK_seed0"] and saved["missing_models"] == []
    text = (tmp_path / "out" / "mask_volume.md").read_text()
    assert text.startswith("# How large the held-out predictions are") and "| HK | uniform | 0 |" in text


def test_the_shared_report_helpers(tmp_path):
    from benchmarks.folder_report import number, report_folder, seed_difference, write_report

    assert number(None) == "-" and number(0.12345) == "0.123" and number(0.5, signed=True) == "+0.500"
    assert seed_difference(None) == "-"
    assert seed_difference({"mean": -0.1, "low": None, "n_seeds": 1}) == "-0.100 (1 seed)"
    d = {"mean": 0.05, "low": 0.01, "high": 0.09, "p": {"value": 0.0421, "kind": "t", "resamples": 0}, "n_seeds": 5}
    assert seed_difference(d) == "+0.050 [+0.010, +0.090], t p 0.042 (5 seeds)"
    d["p"]["value"] = 2e-5  # printed as PValue prints it, not as 0.000
    assert seed_difference(d) == "+0.050 [+0.010, +0.090], t p 2.0e-05 (5 seeds)"
    with pytest.raises(ValueError, match="no NaN"):
        write_report(tmp_path / "report", "r", "text", {"ratio": float("nan")})
    assert not (tmp_path / "report" / "r.json").exists() and not (tmp_path / "report" / "r.md").exists()
    with pytest.raises(ValueError, match="not a benchmark results folder"):
        report_folder(tmp_path, None)
    assert report_folder(PROSTATE, tmp_path / "elsewhere") == tmp_path / "elsewhere"


def test_a_run_whose_model_is_gone_keeps_its_earlier_row_while_its_record_is_unchanged(tmp_path, synthetic_root):
    folder = tmp_path / "results"
    for seed in (0, 1):
        _run(folder, synthetic_root["prostate"], "uniform", seed)
    (folder / "sweep.json").write_text((PROSTATE / "sweep.json").read_text())
    assert main([str(folder)]) == 0
    first = json.loads((folder / "mask_volume.json").read_text())["runs"]
    assert [r["scored_here"] for r in first] == [True, True]

    # A new machine: seed 0's model is gone, seed 1's run was made again with other results, seed 2 is new.
    import shutil

    shutil.rmtree(folder / "runs" / "prostate_uniform_HK_seed0" / "ws")
    shutil.rmtree(folder / "runs" / "prostate_uniform_HK_seed1" / "ws")
    rerun = folder / "runs" / "prostate_uniform_HK_seed1" / "run.json"
    record = json.loads(rerun.read_text())
    record["report"]["models"]["final"]["sites"]["HK"]["splits"]["test"]["cases"]["0"]["prostate"]["dice"] += 0.1
    rerun.write_text(json.dumps(record))
    _run(folder, synthetic_root["prostate"], "uniform", 2)
    assert main([str(folder)]) == 0
    saved = json.loads((folder / "mask_volume.json").read_text())
    kept = {r["run_id"]: r for r in saved["runs"]}
    assert kept["prostate_uniform_HK_seed0"] == {**first[0], "scored_here": False}  # the row as it was scored
    assert kept["prostate_uniform_HK_seed2"]["scored_here"] is True
    assert saved["missing_models"] == ["prostate_uniform_HK_seed1"]  # its record no longer matches the row
    text = (folder / "mask_volume.md").read_text()
    assert "Runs: 2, 1 scored on this machine and 1 kept" in text and "(left out): 1." in text
    assert "| HK | uniform | 0 | " in text and text.count("| earlier |") == 1

    (folder / "mask_volume.json").write_text("{not json")
    assert main([str(folder)]) == 2  # named, not measured over


def test_an_earlier_row_is_kept_only_when_it_was_checked_against_the_record():
    from benchmarks.mask_volume import earlier_row

    row = {"dice": 0.5, "max_dice_difference": 0.0}
    assert earlier_row(row, np.array([0.4, 0.6])) is row
    assert earlier_row(row, np.array([0.4, 0.7])) is None  # the run's record moved
    assert earlier_row({"dice": 0.52, "max_dice_difference": 0.03}, np.array([0.4, 0.6])) is not None
    assert earlier_row({"dice": 0.5, "max_dice_difference": None}, np.array([0.4, 0.6])) is None
    assert earlier_row(None, np.array([0.5])) is None and earlier_row(row, None) is None
