"""The sweep's plan without running it: what a seed changes, one protocol per folder, runs validated up front."""

from __future__ import annotations

import copy

import pytest

from feddg.benchmark.sweep import Protocol, Run, plan, prepare_folder, run_experiment, seed_overrides
from feddg.config import ConfigError


def test_a_seed_sets_the_training_seed_and_the_methods_seeds_never_the_splits_or_the_data():
    exp = run_experiment(Protocol("prostate"), Run("prostate", "mlabin", "BMC", 7))
    assert exp["train"]["seed"] == 7 and exp["mla"]["encoder_seed"] == 7 and exp["mla"]["attention_seed"] == 7
    assert exp["data"]["split_seed"] == 0 and exp["data"]["synthetic"]["seed"] == 0
    assert exp["data"]["unseen_site"] == "BMC"
    assert seed_overrides({"data": {"split_seed": 0}, "ga": {"step_size": 0.05}}, 3) == {"train": {"seed": 3}}


def test_a_folder_keeps_one_protocol(tmp_path):
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}))
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}))  # the same: resumed
    with pytest.raises(ConfigError, match='made with overrides = {"train": {"rounds": 2}}'):
        prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 3}}))
    with pytest.raises(ConfigError, match="made with task"):
        prepare_folder(tmp_path, Protocol("prostate", {"train": {"rounds": 2}}))


def test_every_run_is_validated_before_any_runs():
    runs = plan(Protocol("fundus"), ["fedavg", "elcfs_ga", "fedprox"], ["Domain1", "Domain4"], [0, 1])
    assert len(runs) == 12 and runs[0].run_id == "fundus_fedavg_Domain1_seed0"
    with pytest.raises(ValueError, match="unknown method"):
        plan(Protocol("fundus"), ["fedavg", "fedsr"], ["Domain1"], [0])
    with pytest.raises(ConfigError, match="data.unseen_site"):
        plan(Protocol("fundus"), ["fedavg"], ["Domain9"], [0])


def test_the_tables_are_rewritten_after_every_run_and_finished_runs_are_not_redone(tmp_path, monkeypatch):
    from feddg.benchmark import sweep as sweep_module

    ran, tables = [], []

    def fake_execute(run, protocol, out, timeout, report):
        ran.append(run.run_id)
        record = {"run": run.__dict__, "run_id": run.run_id, "status": "ok", "wall_s": 1.0}
        (out / "runs" / run.run_id).mkdir(parents=True)
        (out / "runs" / run.run_id / sweep_module.RUN_FILE).write_text(__import__("json").dumps(record))
        return record

    monkeypatch.setattr(sweep_module, "execute", fake_execute)
    args = (tmp_path, Protocol("fundus"), ["fedavg", "fedprox"], ["Domain1"], [0])
    sweep_module.sweep(*args, report=lambda _: None, after_run=lambda: tables.append(len(ran)))
    assert tables == [1, 2]
    sweep_module.sweep(*args, report=lambda _: None, after_run=lambda: tables.append(len(ran)))
    assert ran == ["fundus_fedavg_Domain1_seed0", "fundus_fedprox_Domain1_seed0"] and tables == [1, 2]


def _record(method: str, site: str, seed: int, dice: dict[str, float]) -> dict:
    from feddg.jobs import TASK_DEFAULTS

    config = copy.deepcopy(TASK_DEFAULTS["fundus"])
    test = {name: {"dice": {"mean": value}, "hd95": {"mean": 3.0}, "asd": {"mean": 1.0}}
            for name, value in dice.items()}
    return {"status": "ok", "run": {"method": method, "held_out": site, "seed": seed}, "config": config,
            "report": {"models": {"final": {"sites": {site: {"splits": {"test": test}}}}}}}


def test_the_seed_spread_lists_each_seed_of_the_cells_run_with_several():
    from feddg.benchmark.results import seed_spread

    records = [_record("fedavg", "Domain1", 0, {"disc": 0.90, "cup": 0.70}),
               _record("fedavg", "Domain1", 2, {"disc": 0.80, "cup": 0.60}),
               _record("fedavg", "Domain1", 1, {"disc": 0.86, "cup": 0.66}),
               _record("fedavg", "Domain2", 0, {"disc": 0.90, "cup": 0.70}),  # one seed: no spread to show
               {**_record("elcfs", "Domain1", 1, {"disc": 0.5, "cup": 0.5}), "status": "failed"},
               _record("elcfs", "Domain1", 0, {"disc": 0.88, "cup": 0.72})]
    spread = seed_spread(records)
    assert list(spread) == [("fedavg", "Domain1")]  # elcfs has one finished seed only
    assert list(spread[("fedavg", "Domain1")]) == [0, 1, 2]
    assert spread[("fedavg", "Domain1")] == pytest.approx({0: 0.80, 1: 0.76, 2: 0.70})  # mean of disc and cup
    from feddg.benchmark.results import comparisons, markdown

    table = markdown(records, comparisons(records), ["fedavg", "elcfs"], ["Domain1", "Domain2"])
    assert "| method | held-out | seed 0 | seed 1 | seed 2 | max - min |" in table
    assert "| fedavg | Domain1 | 0.800 | 0.760 | 0.700 | 0.100 |" in table
    assert "| fedavg | Domain1 (3 seeds) |" not in table and "0.753 (3 seeds)" in table  # the pooled cell says so


def test_the_csv_rows_do_not_depend_on_the_order_the_sites_reported_in():
    from feddg.benchmark.results import tidy_rows

    record = _record("fedavg", "Domain1", 0, {"disc": 0.9, "cup": 0.7})
    record["run"]["task"] = "fundus"
    test = record["report"]["models"]["final"]["sites"]["Domain1"]["splits"]["test"]
    for name in ("disc", "cup"):
        test[name]["n_cases"] = 3
        for metric in ("dice", "hd95", "asd"):
            test[name][metric]["std"] = 0.0
    record["report"]["models"]["final"]["sites"]["Domain0"] = {"splits": {"test": test}}  # arrived second
    swapped = copy.deepcopy(record)
    sites = swapped["report"]["models"]["final"]["sites"]
    swapped["report"]["models"]["final"]["sites"] = {k: sites[k] for k in reversed(list(sites))}
    assert [r["site"] for r in tidy_rows([record])][0] == "Domain0"
    assert tidy_rows([record]) == tidy_rows([swapped])


def test_the_tables_name_the_software_versions_of_the_runs():
    from feddg.benchmark.results import software_of_runs

    def of(version: str | None, status: str = "ok") -> dict:
        record = _record("fedavg", "Domain1", 0, {"disc": 0.9, "cup": 0.7})
        if version:
            record["report"]["versions"] = {"feddg-flare": version}
        return {**record, "status": status}

    assert software_of_runs([of("0.1.0"), of("0.1.0")]) == "feddg-flare 0.1.0 (2 runs)"
    assert software_of_runs([of("0.1.1"), of("0.1.0"), of("0.1.1"), of(None), of("0.2.0", "failed")]) == \
        "feddg-flare 0.1.0 (1 run), 0.1.1 (2 runs), unknown (1 run)"  # failed runs have no scores to attribute
