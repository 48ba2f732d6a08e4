"""Every timing script under benchmarks/ runs end to end on a tiny setting: a benchmark nobody runs breaks unseen
(round_time.py died with KeyError after 7.6 minutes of measuring, before writing anything)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPOSITORY, TINY_HELD_OUT_CASES, on_poc_ports, tiny_overrides, tiny_sets


pytestmark = pytest.mark.slow


def _run(script: str, *args: str, cache: Path, timeout: float = 600, logs: Path | None = None) -> str:
    """The script's stdout; on a failure, its output and the end of every ``*.log`` under ``logs`` (the simulator
    logs a CI machine does not keep)."""
    env = {**os.environ, "FEDDG_CACHE": str(cache)}
    result = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=REPOSITORY, env=env,
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        tails = "".join(f"\n--- {log}:\n{log.read_text(errors='replace')[-2000:]}"
                        for log in (sorted(logs.rglob("*.log")) if logs is not None else []))
        pytest.fail(result.stdout[-3000:] + result.stderr[-3000:] + tails)
    return result.stdout


def test_gradalign_time(tmp_path):
    out = _run("gradalign_time.py", "--sites", "3", "--repeats", "1", cache=tmp_path)
    assert "ratio aligned / plain" in out


def test_augmentation_time(tmp_path):
    out = _run("augmentation_time.py", "--job", "fundus_fedavg", "--repeats", "1", cache=tmp_path)
    assert "batched on the device" in out and "no augmentation" in out


def test_elcfs_time(tmp_path):
    out = _run("elcfs_time.py", "--task", "fundus", "--steps", "1", "--repeats", "1", cache=tmp_path)
    assert "elcfs n_t=1" in out


def test_elcfs_boundary_ablation(tmp_path):
    out = _run("elcfs_boundary_ablation.py", "--task", "fundus", "--epochs", "1", cache=tmp_path)
    assert "episodic + boundary" in out


def test_mla_standardization(tmp_path):
    out = _run("mla_standardization.py", "--task", "fundus", "--seeds", "0", "--epochs", "1,2", *tiny_sets("fundus"),
               cache=tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("| standardized") or line.startswith("| raw")]
    assert len(rows) == 4 and "Domain1's weights" in out and "raw features: per-feature mean" in out


def test_mla_standardization_scores_a_bundles_local_models_with_each_modules_weights(tmp_path):
    import torch

    from feddg.experiment import experiment_from_dict
    from feddg.flare.mla.bundle import save_bundle
    from feddg.flare.mla.settings import random_feature_encoder
    from feddg.jobs import experiment
    from feddg.methods.mla.attention import DomainAttention
    from feddg.nets.unet import build_model

    cfg = experiment_from_dict(experiment("fundus", "mlabin", tiny_overrides("fundus")))
    torch.manual_seed(0)
    models = {site: build_model(cfg) for site in cfg.data.train_sites}
    encoder = random_feature_encoder(cfg)
    bundle = save_bundle(tmp_path / "bundle", models, encoder, DomainAttention(encoder.out_features, len(models)), cfg)
    out = _run("mla_standardization.py", "--seeds", "0", "--epochs", "1", "--bundle", str(bundle),
               cache=tmp_path / "cache")
    assert "the bundle's own DAM" in out and "averaged uniformly" in out and "| Domain1 Dice |" in out
    rows = [line for line in out.splitlines() if line.startswith("| standardized") or line.startswith("| raw")]
    assert len(rows) == 2 and all(line.count("[") == 3 for line in rows)  # bank, validation and Dice spreads


TINY = tiny_sets("fundus", TINY_HELD_OUT_CASES)


def test_round_time_writes_its_measurements(tmp_path):
    _run("round_time.py", "--job", "fundus_fedavg", "--rounds", "1", "--skip-local", *TINY, "--out",
         str(tmp_path / "rt"), cache=tmp_path / "cache")
    results = json.loads((tmp_path / "rt" / "round_time.json").read_text())
    assert results["rounds"] == 1 and len(results["federated"]["rounds"]) == 1
    assert "torch " + results["versions"]["torch"] in (tmp_path / "rt" / "round_time.md").read_text()


def test_round_time_breaks_a_protocol_run_into_its_parts_beside_nvflares_own_rounds(tmp_path):
    """--protocol runs the sweep's timing cell (here 2 rounds of a tiny setting) with the sweep's CPU numerics and
    breaks the whole run down (every part present, the parts within the run's wall time); --anchors runs NVFlare's
    trivial job and its PyTorch FedAvg recipe (our U-Net and data) beside it: each a measured round, and the table
    of ratios."""
    # each of its three simulator runs bounded by the script itself (which stops all of a run's processes and names
    # its log), well within the test's own limit
    _run("round_time.py", "--protocol", "fundus", "--rounds", "2", "--skip-local", "--anchors", "--anchor-rounds",
         "3", *TINY, "--timeout", "300", "--out", str(tmp_path / "rt"), cache=tmp_path / "cache", timeout=1200,
         logs=tmp_path / "rt")
    results = json.loads((tmp_path / "rt" / "round_time.json").read_text())
    assert results["protocol"] == "fundus" and results["rounds"] == 2 and results["job"] == "fundus_fedavg"
    assert results["env"]["FEDDG_CPU_PIN"] == "off"  # as the sweep runs (SWEEP_CPU_PIN)
    phases = results["federated"]["phases"]
    assert set(phases) == {"start_up_s", "site_info_s", "rounds_s", "evaluation_s", "report_s", "exit_s", "wall_s"}
    parts = phases["start_up_s"] + phases["rounds_s"] + phases["evaluation_s"] + phases["report_s"] + phases["exit_s"]
    assert 0 < parts <= phases["wall_s"] + 1e-6 and phases["site_info_s"] < phases["start_up_s"]
    for name in ("trivial", "recipe"):
        assert results["anchors"][name]["round_s"] > 0 and results["anchors"][name]["rounds_timed"] >= 1, name
        assert results["anchors"][name]["simulator_starts"] in (1, 2), name
    markdown = (tmp_path / "rt" / "round_time.md").read_text()
    assert "| end-of-run evaluation (final and best model, every site) |" in markdown
    assert "| NVFlare's trivial job (ScatterAndGather, NumPy, nothing to compute) |" in markdown
    assert "| NVFlare's PyTorch FedAvg recipe (same U-Net, data, batches, threads) |" in markdown
    # the recipe's clients ran our client script (anchor_train.py), shipped in the exported job
    assert list((tmp_path / "rt" / "anchors" / "recipe_export").rglob("anchor_train.py"))


def test_an_anchors_round_times_come_from_the_server_log(tmp_path):
    """Both log shapes: ScatterAndGather's one-line record and FedAvg's framed message (the words on a later line);
    round 0 (data loading) is left out."""
    from benchmarks.anchors import round_times

    log = tmp_path / "log"
    log.write_text("2026-11-28 09:00:00,000 - INFO - Round 0 started.\n"
                   "2026-11-28 09:00:05,000 - INFO - \n----\n        Round 1 started.\n----\n"
                   "2026-11-28 09:00:05,500 - INFO - some other line\n"
                   "2026-11-28 09:00:06,250 - INFO - Round 2 started.\n"
                   "2026-11-28 09:00:07,000 - INFO - Round 3 started.\n")
    assert round_times(log) == pytest.approx([1.25, 0.75])


def test_round_time_refuses_a_wrong_setting_before_running(tmp_path):
    result = subprocess.run([sys.executable, "benchmarks/round_time.py", "--protocol", "fundus", "--set",
                             "train.rounds=zero", "--out", str(tmp_path / "rt")], cwd=REPOSITORY, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "train.rounds" in result.stderr
    assert not (tmp_path / "rt" / "workspace").exists()


def test_sweep_throughput_writes_its_measurements(tmp_path):
    tiny = tiny_sets("fundus", TINY_HELD_OUT_CASES, local_epochs=1)
    out = _run("sweep_throughput.py", "--runs", "2", "--rounds", "2", "--parallel", "1,2", *tiny,
               "--out", str(tmp_path / "st"), cache=tmp_path / "cache")
    results = json.loads((tmp_path / "st" / "sweep_throughput.json").read_text())
    assert [s["parallel"] for s in results["sweeps"]] == [1, 2]
    for sweep in results["sweeps"]:
        assert sweep["statuses"] == ["ok", "ok"] and sweep["runs_per_hour"] > 0
        assert sweep["runs_per_hour"] == pytest.approx(3600 * 2 / sweep["wall_s"], rel=1e-3)
    assert "| 2 | 2 |" in (tmp_path / "st" / "sweep_throughput.md").read_text() and "runs per hour" in out


@on_poc_ports
def test_round_layouts_times_the_simulator_and_a_poc_side_by_side_with_the_same_scores(tmp_path):
    """The sweep's timing cell (3 rounds of a tiny setting) in the simulator at two task_request_intervals and in a
    local POC at one: every layout timed, and its per-case scores bit for bit the first layout's."""
    _run("round_layouts.py", "--protocol", "fundus", "--rounds", "3", "--intervals", "0.25,0.05", *TINY,
         "--out", str(tmp_path / "rl"), cache=tmp_path / "cache")
    results = json.loads((tmp_path / "rl" / "round_layouts.json").read_text())
    layouts = [(x["layout"], x["interval"]) for x in results["layouts"]]
    assert layouts == [("simulator, every site at once", 0.25), ("simulator, every site at once", 0.05),
                       ("POC, every site a client process", 0.25), ("POC, every site a client process", 0.05)]
    reference = results["layouts"][0]["scores"]
    assert reference["final"] and all(x["scores"] == reference for x in results["layouts"])
    assert all(x["round_s"] > 0 and x["wall_s"] > x["round_s"] for x in results["layouts"])
    path = ("last_site_wait_s", "last_site_task_s", "after_last_s")  # the simulator's sites write their timings here
    for x in results["layouts"]:
        assert all((k in x) == x["layout"].startswith("simulator") for k in path), x
        assert all(x[k] >= 0 for k in path if k in x), x
    markdown = (tmp_path / "rl" / "round_layouts.md").read_text()
    assert markdown.count("| identical |") == 3 and "| the reference |" in markdown


def test_round_layouts_reports_a_failed_layout_and_runs_the_others(tmp_path):
    """A run that times out is a row naming the failure, not a zero; the other layouts still run and the script
    exits 1."""
    result = subprocess.run([sys.executable, "benchmarks/round_layouts.py", "--protocol", "fundus", "--rounds", "3",
                             "--intervals", "0.25", "--processes", "2", "--no-poc", "--timeout", "2", *TINY,
                             "--out", str(tmp_path / "rl")], cwd=REPOSITORY, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "rl" / "round_layouts.json").read_text())
    assert [x["layout"] for x in results["layouts"]] == ["simulator, every site at once", "simulator -t 2"]
    assert all("stopped after 2 s" in x["failed"] for x in results["layouts"]), results["layouts"]
    assert "| failed: " in (tmp_path / "rl" / "round_layouts.md").read_text()


def test_round_layouts_refuses_a_wrong_interval_before_running(tmp_path):
    result = subprocess.run([sys.executable, "benchmarks/round_layouts.py", "--protocol", "fundus", "--intervals",
                             "0.25,soon", "--out", str(tmp_path / "rl")], cwd=REPOSITORY, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "--intervals" in result.stderr
    assert not (tmp_path / "rl").exists()
