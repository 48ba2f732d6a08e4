"""End to end: the real jobs in the real NVFlare simulator, on tiny synthetic sites.

Each run goes through ``feddg simulate`` (the README's path), in its own process group so that a hung run is
stopped by the id of the process this test started, and nothing else.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from feddg.flare.timings import TIMINGS_FILE, read_timings, server_phases, server_rounds
from feddg.recipes.export import write_job
from tests.processes import run_bounded
from tests.conftest import tiny_experiment

pytestmark = pytest.mark.slow
RUN_TIMEOUT_S = 600


def run_job(job: Path, workspace: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_bounded([sys.executable, "-m", "feddg.cli", "simulate", str(job), "-w", str(workspace), *extra],
                       RUN_TIMEOUT_S)


def make_job(tmp_path: Path, name: str, root: Path, sites: list[str] | None = None, **train) -> Path:
    """The committed job ``name`` at test size; ``sites`` (data.sites, the unseen one included) keeps a run that
    starts a process per task to the sites its claim needs."""
    task = name.split("_", 1)[0]
    exp = tiny_experiment(task, root=str(root), **train)
    if sites is not None:
        exp["data"]["sites"] = sites
    return write_job(tmp_path / "jobs", name, exp)


def check_run(result: subprocess.CompletedProcess, ws: Path, exp_sites: list[str], unseen: str,
              structures: list[str], rounds: int) -> dict:
    assert result.returncode == 0, result.stdout[-5000:]
    run = ws / "server" / "simulate_job"
    report_path = run / "feddg_report.json"
    assert report_path.exists(), result.stdout[-5000:]
    assert (run / "app_server" / "FL_global_model.pt").exists()
    assert (run / "app_server" / "best_FL_global_model.pt").exists()
    report = json.loads(report_path.read_text())
    assert [h["round"] for h in report["history"]] == list(range(rounds))
    train_sites = [s for s in exp_sites if s != unseen]
    for h in report["history"]:
        assert sorted(h["sites"]) == sorted(train_sites)  # every training site, never the unseen one
    assert report["unseen_site"] == unseen
    for model in ("final", "best"):
        sites = report["models"][model]["sites"]
        assert sorted(sites) == sorted(exp_sites)
        assert sites[unseen]["role"] == "unseen" and list(sites[unseen]["splits"]) == ["test"]
        for site, entry in sites.items():
            for split, summary in entry["splits"].items():
                for s in structures:
                    for metric in ("dice", "hd95", "asd"):
                        value = summary[s][metric]["mean"]
                        assert math.isfinite(value), (model, site, split, s, metric)
    assert 0 <= report["best"]["rounds_trained"] <= rounds
    assert "leave-one-site-out report" in result.stdout
    assert any((run / "tb_events").rglob("events.out.tfevents*")), "no TensorBoard events written"
    assert not (ws / unseen / "simulate_job" / "feddg_site_state").exists(), "the unseen site trained"
    for site in exp_sites:  # every site's process connected under its own name (feddg.flare.simulator)
        log = (ws / site / "log.txt").read_text()
        assert set(re.findall(r"(\S+)\.simulate_job: created backbone external connector", log)) == {site}, site
    return report


def _unit_scores(report: dict) -> dict:
    """(model, site, split) -> the summary's Dice, HD95 and ASD means."""
    return {(model, site, split): [summary["prostate"][m]["mean"] for m in ("dice", "hd95", "asd")]
            for model, entry in report["models"].items() for site, s in entry["sites"].items()
            for split, summary in s["splits"].items()}


def test_prostate_fedavg_all_sites_at_once_equals_one_at_a_time(tmp_path, synthetic_root):
    """`feddg simulate` without -t runs every site's process at once, each with its share of the cores; with -t 1
    every task runs in a fresh process (Adam's step count after two rounds proves round 1 resumed round 0's
    optimizer state from the site's workspace). With the same threads per site (the sites' own num_threads: 1)
    both give the same numbers: scheduling changes nothing but the time. Three sites (two train, RUNMC unseen) make
    the claim as six would, with half of -t 1's process starts."""
    rounds, epochs, batch = 2, 1, 4
    sites = ["BIDMC", "HK", "RUNMC"]
    job = make_job(tmp_path, "prostate_fedavg", synthetic_root["prostate"], sites, rounds=rounds,
                   local_epochs=epochs, batch_size=batch)
    reports = {}
    for mode, extra in (("parallel", ()), ("one", ("-t", "1"))):
        ws = tmp_path / f"ws_{mode}"
        (ws / "local").mkdir(parents=True)
        (ws / "local" / "feddg_site.json").write_text(json.dumps({"num_threads": 1}))
        result = run_job(job, ws, *extra)
        reports[mode] = check_run(result, ws, sites, "RUNMC", ["prostate"], rounds)
        log = (ws / "BIDMC" / "log.txt").read_text()
        assert "1 thread(s), set by the site's num_threads" in log
        expected_processes = len(sites) if mode == "parallel" else 1
        assert f"-t {expected_processes}" in result.stdout and f"FEDDG_SITE_PROCESSES={expected_processes}" in \
            result.stdout
    state = tmp_path / "ws_one" / "BIDMC" / "simulate_job" / "feddg_site_state"
    optimizer = torch.load(state / "optimizer.pt", weights_only=True)
    steps = next(iter(optimizer["state"].values()))["step"].item()
    per_round = json.loads((state / "state.json").read_text())["steps"]
    assert steps == rounds * per_round
    one, parallel = _unit_scores(reports["one"]), _unit_scores(reports["parallel"])
    assert one.keys() == parallel.keys()
    for key in one:
        assert parallel[key] == pytest.approx(one[key], abs=1e-6), key
    assert reports["parallel"]["models"]["final"]["sites"]["RUNMC"]["splits"]["test"]["unit"] == "mm"
    timings = read_timings(tmp_path / "ws_parallel" / "server" / "simulate_job" / TIMINGS_FILE)
    assert [record["round"] for record in server_rounds(timings)] == list(range(rounds))
    assert {"site_info", "evaluate_final", "report"} <= set(server_phases(timings))


def test_fundus_fedavg(tmp_path, synthetic_root):
    job = make_job(tmp_path, "fundus_fedavg", synthetic_root["fundus"], rounds=1)
    ws = tmp_path / "ws"
    result = run_job(job, ws, "-t", "4")
    report = check_run(result, ws, ["Domain1", "Domain2", "Domain3", "Domain4"], "Domain1", ["disc", "cup"], 1)
    assert report["models"]["final"]["sites"]["Domain1"]["splits"]["test"]["unit"] == "px"


def test_prostate_ga_weights_history(tmp_path, synthetic_root):
    rounds = 3
    job = make_job(tmp_path, "prostate_ga", synthetic_root["prostate"], rounds=rounds)
    ws = tmp_path / "ws"
    result = run_job(job, ws, "-t", "6")
    check_run(result, ws, ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"], "RUNMC", ["prostate"], rounds)
    history = json.loads((ws / "server" / "simulate_job" / "ga_weights.json").read_text())["history"]
    assert [h["round"] for h in history] == list(range(rounds))
    for h in history:
        assert sum(h["weights"].values()) == pytest.approx(1.0)
        assert sorted(h["weights"]) == ["BIDMC", "BMC", "HK", "I2CVB", "UCL"]
    assert history[0]["gaps"] == {}  # round 0 carries no gaps
    assert len(history[1]["gaps"]) == 5
    assert max(abs(w - 0.2) for w in history[-1]["weights"].values()) > 1e-3  # moved away from uniform


def test_prostate_gradalign(tmp_path, synthetic_root):
    job = make_job(tmp_path, "prostate_gradalign", synthetic_root["prostate"], rounds=2)
    ws = tmp_path / "ws"
    result = run_job(job, ws, "-t", "6")
    check_run(result, ws, ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"], "RUNMC", ["prostate"], 2)
    assert "feddg.flare.gradalign.aggregator" in (ws / "server" / "simulate_job" / "app_server" / "config"
                                      / "config_fed_server.json").read_text()


def _bank_sites(ws: Path, site: str) -> list[str]:
    import numpy as np

    with np.load(ws / site / "simulate_job" / "feddg_site_state" / "amplitude_bank.npz") as f:
        return sorted(f.files)


def test_fundus_elcfs_one_thread_keeps_the_bank_on_disk(tmp_path, synthetic_root):
    """-t 1: the exchange, the bank delivery and each round run in fresh processes; training finds the bank. Three
    sites (two train, Domain1 unseen): each training site's bank holds the other's amplitudes."""
    sites = ["Domain1", "Domain2", "Domain3"]
    job = make_job(tmp_path, "fundus_elcfs", synthetic_root["fundus"], sites, rounds=1)
    ws = tmp_path / "ws"
    result = run_job(job, ws, "-t", "1")
    check_run(result, ws, sites, "Domain1", ["disc", "cup"], 1)
    assert _bank_sites(ws, "Domain2") == ["Domain3"] and _bank_sites(ws, "Domain3") == ["Domain2"]
    assert not (ws / "Domain1" / "simulate_job" / "feddg_site_state").exists()
    assert "amplitude exchange: distribution bank of 2 sites" in result.stdout


def test_prostate_elcfs_ga(tmp_path, synthetic_root):
    rounds = 2
    job = make_job(tmp_path, "prostate_elcfs_ga", synthetic_root["prostate"], rounds=rounds)
    ws = tmp_path / "ws"
    result = run_job(job, ws, "-t", "6")
    check_run(result, ws, ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"], "RUNMC", ["prostate"], rounds)
    assert _bank_sites(ws, "UCL") == ["BIDMC", "BMC", "HK", "I2CVB"]
    history = json.loads((ws / "server" / "simulate_job" / "ga_weights.json").read_text())["history"]
    assert len(history[1]["gaps"]) == 5  # ELCFS local training still reports GA's generalization gaps


def test_prostate_mlabin_keeps_local_models_builds_the_bundle_and_scores_mla(tmp_path, synthetic_root):
    from feddg.flare.mla.bundle import load_bundle

    exp = tiny_experiment("prostate", root=str(synthetic_root["prostate"]), rounds=1)
    exp["mla"] = {"attention_epochs": 5}
    job = write_job(tmp_path / "jobs", "prostate_mlabin", exp)
    ws = tmp_path / "ws"
    result = run_job(job, ws, "-t", "6")
    sites = ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"]
    report = check_run(result, ws, sites, "RUNMC", ["prostate"], 1)
    train_sites = [s for s in sites if s != "RUNMC"]
    assert "this job asks the sites' own settings {'share_local_model': True}" in result.stdout
    run = ws / "server" / "simulate_job"
    assert sorted(json.loads((run / "mla_local_models" / "index.json").read_text())["sites"]) == train_sites
    bundle = load_bundle(run / "mla_bundle")
    assert bundle.sites == train_sites and bundle.config.model.bin_levels == 3
    assert report["mla"]["skipped"] is None and report["mla"]["sites"] == train_sites
    assert 0.0 <= report["mla"]["attention_accuracy"] <= 1.0
    assert sorted(report["models"]["mla"]["sites"]) == sites
    unseen = report["models"]["mla"]["sites"]["RUNMC"]
    assert unseen["role"] == "unseen" and list(unseen["splits"]) == ["test"]
    for metric in ("dice", "hd95", "asd"):
        assert math.isfinite(unseen["splits"]["test"]["prostate"][metric]["mean"])
    assert sum(report["mla"]["attention_weights"]["RUNMC"]["weights"].values()) == pytest.approx(1.0)
    assert any(r["model"] == "mla" and r["site"] == "RUNMC" for r in report["table"])
    assert "MLA at the unseen site RUNMC" in result.stdout


def test_resume_continues_from_the_last_global_model_and_round(tmp_path, synthetic_root):
    """A 2-round GA run, then `feddg resume-job --rounds 4`: the new job trains rounds 2 and 3 only, starts from the
    saved model, and continues the GA weight history, so the whole training has exactly 4 rounds."""
    job = make_job(tmp_path, "prostate_ga", synthetic_root["prostate"], rounds=2)
    ws1 = tmp_path / "ws1"
    check_run(run_job(job, ws1, "-t", "6"), ws1, ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"], "RUNMC",
              ["prostate"], 2)
    resumed = tmp_path / "resumed"
    proc = subprocess.run([sys.executable, "-m", "feddg.cli", "resume-job", str(job), "--from",
                           str(ws1 / "server" / "simulate_job"), "--out", str(resumed), "--rounds", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rounds 2..3 of 4" in proc.stdout
    ws2 = tmp_path / "ws2"
    result = run_job(resumed, ws2, "-t", "6")
    assert result.returncode == 0, result.stdout[-5000:]
    report = json.loads((ws2 / "server" / "simulate_job" / "feddg_report.json").read_text())
    assert [h["round"] for h in report["history"]] == [2, 3]
    assert report["rounds"] == 4
    ga = json.loads((ws2 / "server" / "simulate_job" / "ga_weights.json").read_text())["history"]
    assert [h["round"] for h in ga] == [0, 1, 2, 3]  # the previous run's history, continued
