"""The leave-one-site-out sweep end to end on a tiny fundus protocol: real simulator runs, outputs with finite numbers
for every cell, resume without redoing a run (every run's own config checked against the folder's protocol), data
that fail the data check and another protocol refused; and `--set` on a job whose amplitude windows depend on the
image size."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from feddg.cli import main
from feddg.flare.constants import PROGRESS_FILE, FedDGMeta
from feddg.flare.controller import ROUNDS_COMPLETED
from feddg.inference import read_checkpoint
from feddg.report import code_fingerprint
from tests.conftest import REPOSITORY, TINY_HELD_OUT_CASES, tiny_sets

pytestmark = pytest.mark.slow

TINY = tiny_sets("fundus", TINY_HELD_OUT_CASES, rounds=2, local_epochs=1)
# Three of fundus's four sites: each of the sweep's runs trains two (the held-out one evaluates), which is all its
# outputs need. Gradient alignment needs three training sites to act (the sweep refuses it with two), so its test
# keeps all four.
THREE_SITES = ["--set", "data.sites=[Domain1,Domain2,Domain3]"]
# Two runs at once where the host has the cores (the sweep refuses more than it has): the 12 runs take most of this
# file's time, and runs at once give the same scores as one at a time (tests/e2e/test_sweep_executors.py).
PARALLEL = ["--parallel", str(min(2, os.cpu_count() or 1))]
SWEEP = ["benchmark", "--task", "fundus", "--methods", "fedavg,ga", "--held-out", "Domain1,Domain2", "--seeds", "0-2",
         "--resamples", "500", "--run-timeout", "600", *PARALLEL, *TINY, *THREE_SITES]


def test_sweep_outputs_resume_failure_and_protocol(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results"
    assert main([*SWEEP, "--out", str(out)]) == 0

    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == [f"fundus_{m}_{s}_seed{k}" for m in ("fedavg", "ga") for s in ("Domain1", "Domain2")
                    for k in range(3)]
    rows = list(csv.DictReader(open(out / "results.csv")))
    held = [r for r in rows if r["site"] == r["held_out"] and r["split"] == "test" and r["model"] == "final"]
    assert {(r["method"], r["held_out"], r["structure"], r["metric"]) for r in held} == {
        (m, s, n, k) for m in ("fedavg", "ga") for s in ("Domain1", "Domain2") for n in ("disc", "cup")
        for k in ("dice", "hd95", "asd")}
    assert all(math.isfinite(float(r["mean"])) for r in held)
    assert all(int(r["n_cases"]) == 6 for r in held), "the held-out site has its own, larger number of cases"
    table = (out / "results.md").read_text()
    for view in ("Dice, disc", "Dice, cup", "Dice, mean", "HD95 (px), mean", "ASD (px), cup", "difference to fedavg"):
        assert view in table
    ga_row = next(line for line in table.splitlines() if line.startswith("| ga |") and "[" in line)
    assert ga_row.count("[") == 3 and ga_row.count("3 seeds") == 3  # Domain1, Domain2 and the average: intervals
    assert "**ga** vs fedavg:" in table
    for name in ("validation_dice.png", "ga_weights.png", "held_out_dice.png"):
        assert (out / "plots" / name).stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    assert results["tables_written_on"]["cores"] >= 1 and results["versions"]["nvflare"] == "2.9.0"
    average = results["comparisons"]["fedavg"]["ga"]["average"]
    assert math.isfinite(average["mean"]) and average["low"] <= average["mean"] <= average["high"]
    assert average["n_seeds"] == 3 and average["p"]["kind"] == "t" and average["flip_p"]["kind"] == "exact"
    entry = next(r for r in results["runs"] if r["run_id"] == "fundus_ga_Domain2_seed0")
    assert "report" not in entry, "results.json names each run's run.json instead of copying its report"
    record = json.loads((out / entry["record"]).read_text())
    assert entry["record"] == "runs/fundus_ga_Domain2_seed0/run.json"
    assert record["config"]["data"]["unseen_site"] == "Domain2" and record["config"]["train"]["seed"] == 0
    assert record["code"] == code_fingerprint()
    history = record["report"]["history"]
    assert history[1]["aggregation"]["ga_step"] > 0 and set(history[1]["aggregation"]["ga_gaps"]) == {
        "Domain1", "Domain3"}, "GA's gaps and weights of every round reach run.json"
    cases = record["report"]["models"]["final"]["sites"]["Domain2"]["splits"]["test"]["cases"]
    assert list(cases) == [str(i) for i in range(6)] and "png" not in json.dumps(cases)
    kept = out / "runs" / "fundus_ga_Domain2_seed0"
    assert not (kept / "ws").exists(), "the simulator's workspace is removed"
    assert sorted(p.name for p in kept.glob("*.pt")) == ["FL_global_model.pt"], "only the final model is kept"
    model = read_checkpoint(kept / "FL_global_model.pt")  # the run's last model: its run id and round count
    progress = json.loads((kept / PROGRESS_FILE).read_text())
    assert model.meta[FedDGMeta.RUN_ID] == progress["run_id"] and model.config.data.unseen_site == "Domain2"
    assert model.meta[ROUNDS_COMPLETED] == progress["rounds_completed"] == record["config"]["train"]["rounds"]

    # Resume: nothing is run again and the numbers stay the same.
    before = (out / "results.csv").read_text()
    stamp = (out / "runs" / "fundus_fedavg_Domain1_seed0" / "run.json").stat().st_mtime_ns
    assert main([*SWEEP, "--out", str(out)]) == 0
    assert (out / "runs" / "fundus_fedavg_Domain1_seed0" / "run.json").stat().st_mtime_ns == stamp
    assert (out / "results.csv").read_text() == before

    # A command for part of the folder (one method, one site) runs nothing and keeps every run in the tables.
    part = ["benchmark", "--task", "fundus", "--methods", "fedavg", "--held-out", "Domain2", "--seeds", "0-1",
            "--resamples", "500", "--run-timeout", "600", *TINY, *THREE_SITES, "--out", str(out)]
    assert main(part) == 0
    assert (out / "results.csv").read_text() == before
    assert "| ga |" in (out / "results.md").read_text() and "Domain1" in (out / "results.md").read_text()

    # Another protocol in the same folder is refused by name.
    other = [*SWEEP, "--out", str(out), "--set", "train.lr=0.01"]
    assert main(other) == 2

    # A data root that fails the data check (three sites missing) is refused before any run, naming the cause; a run
    # that fails is recorded as failed and the sweep goes on (tests/test_sweep_record.py, with a fake simulator).
    broken = tmp_path / "broken"
    (broken / "Domain1").mkdir(parents=True)
    code = main(["benchmark", "--task", "fundus", "--methods", "fedavg", "--held-out", "Domain1,Domain2", "--seeds", "0",
                 "--resamples", "200", "--run-timeout", "300", *TINY, "--data-root", str(broken),
                 "--out", str(tmp_path / "failing")])
    assert code == 2 and not (tmp_path / "failing").exists()


def test_gradient_alignments_corrections_reach_run_json(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results"
    assert main(["benchmark", "--task", "fundus", "--methods", "gradalign", "--held-out", "Domain1", "--seeds", "0",
                 "--resamples", "200", "--run-timeout", "600", *TINY, "--out", str(out)]) == 0
    record = json.loads((out / "runs" / "fundus_gradalign_Domain1_seed0" / "run.json").read_text())
    for entry in record["report"]["history"]:
        corrections = entry["aggregation"]["gradalign_corrections"]
        assert isinstance(corrections, int) and 0 <= corrections <= 3 * 2  # 3 sites, each visits the 2 others
        assert set(entry["aggregation"]["gradalign_corrected_sites"]) <= {"Domain2", "Domain3", "Domain4"}


def test_an_unknown_override_is_refused_by_name(tmp_path, capsys):
    assert main([*SWEEP, "--out", str(tmp_path / "x"), "--set", "train.roundz=3"]) == 2
    assert "train.roundz: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "x" / "runs").exists()


def test_simulate_with_a_larger_image_size_runs_the_elcfs_exchange(tmp_path, synthetic_root):
    """The amplitude windows follow data.image_size at run time: --set data.image_size=256 on an ELCFS job must not
    block the exchange (it did when the window was frozen into the job's filters)."""
    ws = tmp_path / "ws"
    command = [sys.executable, "-m", "feddg.cli", "simulate", "jobs/fundus_elcfs", "-w", str(ws),
               "--set", "data.image_size=256", "--set", f"data.root={synthetic_root['fundus']}",
               "--set", "train.rounds=1", "--set", "train.local_epochs=1", "--set", "model.features=[8,8,16,32,64,8]",
               "--set", "data.sites=[Domain1,Domain2,Domain3]"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((ws / "server" / "simulate_job" / "feddg_report.json").read_text())
    assert report["config"]["data"]["image_size"] == 256
    assert (ws / "Domain2" / "simulate_job" / "feddg_site_state" / "amplitude_bank.npz").exists()
    meta = json.loads((tmp_path / "ws_job" / "fundus_elcfs" / "meta.json").read_text())
    assert meta["deploy_map"]["app"] == ["server", "Domain1", "Domain2", "Domain3"] and meta["min_clients"] == 2
