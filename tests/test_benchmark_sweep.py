"""The sweep's plan without running it: what a seed changes, one protocol per folder, runs validated up front."""

from __future__ import annotations

import json

import copy

import numpy as np

import pytest

from feddg.benchmark.reproduce import REPRODUCE_DIR, admitted_codes
from feddg.benchmark.sweep import Protocol, Run, plan, prepare_folder, run_experiment, seed_overrides
from feddg.folders import COMMITTED_JOBS
from feddg.config import ConfigError
from feddg.numerics import SAME_NUMBERS
from tests.conftest import REPOSITORY


def test_a_seed_sets_the_training_seed_and_the_methods_seeds_never_the_splits_or_the_data():
    exp = run_experiment(Protocol("prostate"), Run("prostate", "mlabin", "BMC", 7))
    assert exp["train"]["seed"] == 7 and exp["mla"]["encoder_seed"] == 7 and exp["mla"]["attention_seed"] == 7
    assert exp["data"]["split_seed"] == 0 and exp["data"]["synthetic"]["seed"] == 0
    assert exp["data"]["unseen_site"] == "BMC"
    assert seed_overrides({"data": {"split_seed": 0}, "ga": {"step_size": 0.05}}, 3) == {"train": {"seed": 3}}


def test_a_folder_keeps_one_protocol_and_a_mismatch_names_the_first_differing_key(tmp_path):
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}))
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}))  # the same: resumed
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2, "lr": 0.001}}))  # the template's lr: the same
    with pytest.raises(ConfigError, match="holds another protocol: train.rounds: 2 in this folder, 3 in this sweep;"):
        prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 3}}))
    with pytest.raises(ConfigError, match="data.image_size: 64 in this folder, 32 in this sweep"):
        prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}, "data": {"image_size": 32}}))
    with pytest.raises(ConfigError, match=r'ga.step_size: 0.05 in this folder, 0.1 in this sweep \(in the feddg.yaml '
                                          r"of ga's runs\)"):
        prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}, "ga": {"step_size": 0.1}}))
    with pytest.raises(ConfigError, match='task: "fundus" in this folder, "prostate" in this sweep'):
        prepare_folder(tmp_path, Protocol("prostate", {"train": {"rounds": 2}}))
    with pytest.raises(ConfigError, match=r'simulator_args: \[\] in this folder, \["-t", "1"\] in this sweep'):
        prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}, ["-t", "1"]))


def test_every_run_is_validated_before_any_runs():
    runs = plan(Protocol("fundus"), ["fedavg", "elcfs_ga", "fedprox"], ["Domain1", "Domain4"], [0, 1])
    assert len(runs) == 12 and [r.run_id for r in runs[:4]] == [  # a seed's pairs before the next seed
        "fundus_fedavg_Domain1_seed0", "fundus_elcfs_ga_Domain1_seed0", "fundus_fedprox_Domain1_seed0",
        "fundus_fedavg_Domain1_seed1"]
    with pytest.raises(ValueError, match="unknown method"):
        plan(Protocol("fundus"), ["fedavg", "fedsr"], ["Domain1"], [0])
    with pytest.raises(ConfigError, match="data.unseen_site"):
        plan(Protocol("fundus"), ["fedavg"], ["Domain9"], [0])


def test_the_tables_are_rewritten_after_every_run_and_finished_runs_are_not_redone(tmp_path, monkeypatch):
    from feddg.benchmark import sweep as sweep_module

    from tests.fake_executor import FakeExecutor

    ran, tables = [], []
    monkeypatch.setattr(sweep_module, "LocalExecutor", lambda: FakeExecutor(ran))
    args = (tmp_path, Protocol("fundus"), ["fedavg", "fedprox"], ["Domain1"], [0])
    sweep_module.sweep(*args, report=lambda _: None, after_run=lambda: tables.append(len(ran)))
    assert tables == [1, 2]
    sweep_module.sweep(*args, report=lambda _: None, after_run=lambda: tables.append(len(ran)))
    assert ran == ["fundus_fedavg_Domain1_seed0", "fundus_fedprox_Domain1_seed0"] and tables == [1, 2]


def test_a_fault_in_writing_the_tables_is_reported_and_the_runs_go_on(tmp_path, monkeypatch):
    """The tables are derived from the records: an error there (once, a results-writer bug with two runs going on
    at once, ended the sweep and took the other run's folder with it) must not stop the runs."""
    from feddg.benchmark import sweep as sweep_module

    from tests.fake_executor import FakeExecutor

    ran, lines = [], []
    monkeypatch.setattr(sweep_module, "LocalExecutor", lambda: FakeExecutor(ran))

    def tables() -> None:
        raise ValueError("no seed was run at every site")

    records = sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg", "fedprox"], ["Domain1"], [0],
                                 report=lines.append, after_run=tables)
    assert ran == ["fundus_fedavg_Domain1_seed0", "fundus_fedprox_Domain1_seed0"]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all((tmp_path / "runs" / run_id / "run.json").exists() for run_id in ran)
    faults = [line for line in lines if line.startswith("the tables were not rewritten")]
    assert faults == [f"the tables were not rewritten after {run_id}: ValueError: no seed was run at every site "
                      "(the runs go on; the records are kept)" for run_id in ran]

    def interrupted() -> None:  # a stop signal is not a fault of the tables: it still ends the sweep
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg", "fedprox"], ["Domain1"], [1],
                           report=lambda _: None, after_run=interrupted)


def _record(method: str, site: str, seed: int, dice: dict[str, float]) -> dict:
    from feddg.experiment import TASK_DEFAULTS

    config = copy.deepcopy(TASK_DEFAULTS["fundus"])
    test = {name: {"dice": {"mean": value}, "hd95": {"mean": 3.0}, "asd": {"mean": 1.0}}
            for name, value in dice.items()}
    return {"status": "ok", "run": {"method": method, "held_out": site, "seed": seed}, "config": config,
            "report": {"models": {"final": {"sites": {site: {"splits": {"test": test}}}}}}}


def test_the_seed_spread_lists_each_seed_of_the_cells_run_with_several():
    from feddg.benchmark.scores import seed_spread

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
    from feddg.benchmark.tables import comparisons, markdown

    table = markdown(records, [comparisons(records)], ["fedavg", "elcfs"], ["Domain1", "Domain2"])
    assert "| method | held-out | seed 0 | seed 1 | seed 2 | max - min |" in table
    assert "| fedavg | Domain1 | 0.800 | 0.760 | 0.700 | 0.100 |" in table
    # a cell: mean over seeds ± seed SD (seeds); the mean column of fundus: 0.753 ± 0.050 (3); the average keeps
    # to seed 0, the one run at both sites: (0.80 + 0.80) / 2
    assert "| fedavg | 0.753 ± 0.050 (3) | 0.800 (1) | 0.800 (seed 0) |" in table
    assert "| elcfs | 0.800 (1) | not run | - |" in table


def test_the_csv_rows_do_not_depend_on_the_order_the_sites_reported_in():
    from feddg.benchmark.scores import tidy_rows

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
    from feddg.benchmark.provenance import software_of_runs

    def of(version: str | None, status: str = "ok") -> dict:
        record = _record("fedavg", "Domain1", 0, {"disc": 0.9, "cup": 0.7})
        if version:
            record["report"]["versions"] = {"feddg-flare": version}
        return {**record, "status": status}

    assert software_of_runs([of("0.1.0"), of("0.1.0")]) == "feddg-flare 0.1.0 (2 runs)"
    assert software_of_runs([of("0.1.1"), of("0.1.0"), of("0.1.1"), of(None), of("0.2.0", "failed")]) == \
        "feddg-flare 0.1.0 (1 run), 0.1.1 (2 runs), unknown (1 run)"  # failed runs have no scores to attribute


# -- seeds, code versions, methods that would not act, the plan's cost -------------------------------------------


def test_seeds_take_lists_and_ranges_and_bad_ones_name_the_flag():
    from feddg.benchmark.sweep import parse_seeds

    assert parse_seeds("0-4") == [0, 1, 2, 3, 4] and parse_seeds("0,2,5-6") == [0, 2, 5, 6]
    for text, message in [("", "--seeds is empty"), ("0,0", r"seed\(s\) \[0\] given twice"),
                          ("-1", "non-negative"), ("0-x", "'0-x' is not a seed"), ("3-1", "runs backwards")]:
        with pytest.raises(ValueError, match=message):
            parse_seeds(text)


def test_a_protocol_under_which_a_method_would_not_act_is_refused_before_any_run():
    with pytest.raises(ConfigError, match=r"ga would not act under this protocol \(fundus_ga_Domain1_seed0\)"):
        plan(Protocol("fundus", {"train": {"rounds": 1}}), ["fedavg", "ga"], ["Domain1"], [0])


def _fake_executor(monkeypatch, sweep_module, code: str, scores=(0.8, 0.6), ran=None, cpu=None, avx512=None,
                   signature=None):
    """The sweep's runs "end" at once with ``scores`` as the held-out site's per-case scores, made by ``code`` (on
    ``cpu``, when given: then as this host's runs, on a host with that CPU, ``avx512`` and CPU ``signature``)."""
    import feddg.numerics
    import feddg.report
    from tests.fake_executor import FakeExecutor

    monkeypatch.setattr(feddg.report, "code_fingerprint", lambda: code)
    if cpu is not None:
        monkeypatch.setattr(feddg.numerics, "cpu_model", lambda: cpu)
        monkeypatch.setattr(feddg.numerics, "cpu_flags", lambda: {"avx512f"} if avx512 else set())
        monkeypatch.setattr(feddg.numerics, "cpu_signature", lambda: signature)
    monkeypatch.setattr(sweep_module, "LocalExecutor",
                        lambda: FakeExecutor([] if ran is None else ran, scores=scores, with_folder=True, cpu=cpu,
                                             avx512=avx512, here=cpu is not None, signature=signature))


def test_runs_of_other_code_are_refused_and_a_reproduce_check_with_identical_scores_admits_the_new_code(
        tmp_path, monkeypatch):
    import json

    from feddg.benchmark import sweep as sweep_module
    from feddg.report import code_fingerprint

    protocol = Protocol("fundus")
    _fake_executor(monkeypatch, sweep_module, "old-code")
    sweep_module.sweep(tmp_path, protocol, ["fedavg"], ["Domain1"], [0], report=lambda _: None)

    ran: list = []
    current = code_fingerprint()
    _fake_executor(monkeypatch, sweep_module, current, ran=ran)
    with pytest.raises(ConfigError, match="made by code old-code.*--reproduce-check"):
        sweep_module.sweep(tmp_path, protocol, ["fedavg"], ["Domain1"], [0, 1], report=lambda _: None)
    assert ran == []  # refused before any run

    sweep_module.sweep(tmp_path, protocol, ["fedavg"], ["Domain1"], [0, 1], reproduce_check=True,
                       report=lambda _: None)
    # seed 0 of the method was re-run in a scratch folder, then the new seed ran in the folder
    assert ran == [("fundus_fedavg_Domain1_seed0", REPRODUCE_DIR),
                   ("fundus_fedavg_Domain1_seed1", tmp_path.name)]
    assert not (tmp_path / REPRODUCE_DIR).exists()
    (check,) = json.loads((tmp_path / "sweep.json").read_text())["code_evidence"]
    assert check["to_code"] == code_fingerprint() and check["admitted"] is True
    (entry,) = check["methods"]
    assert entry["method"] == "fedavg" and entry["run_id"] == "fundus_fedavg_Domain1_seed0" and entry["identical"]
    assert entry["from_code"] == "old-code" and entry["per_case_scores_compared"] == 2


def test_a_reproduce_check_with_other_scores_is_refused_naming_the_case(tmp_path, monkeypatch):
    from feddg.benchmark import sweep as sweep_module
    from feddg.report import code_fingerprint

    _fake_executor(monkeypatch, sweep_module, "old-code")
    sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, code_fingerprint(), (0.8, 0.61))
    with pytest.raises(ConfigError, match=r"fedavg \(fundus_fedavg_Domain1_seed0\) gives other per-case scores .*"
                                          r"\(final.Domain1.test.1.cup.dice: 0.6 with the old code, 0.61 with this "
                                          r"code\)"):
        sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg"], ["Domain1"], [0, 1], reproduce_check=True,
                           report=lambda _: None)


def test_a_pinned_sweep_on_an_avx512_cpu_does_not_join_the_seeds_of_a_cpu_without_it(tmp_path, monkeypatch):
    """The pin caps the instruction set, not the CPU: an AMD EPYC with AVX-512, pinned to AVX2, re-ran two runs of
    an AMD EPYC without it with other numbers (179 and 180 of 204 per-case scores;
    ``benchmarks/results/cpu_check_prostate``), so its pinned runs are a family of their own."""
    from feddg.benchmark import sweep as sweep_module

    out, lines, ran = tmp_path / "amd", [], []
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="AMD EPYC 7B13", avx512=False)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "old-code", ran=ran, cpu="AMD EPYC", avx512=True)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1", "Domain2"], [0, 1], report=lines.append,
                       cpu_pin="avx2")
    assert [r for r, _ in ran] == ["fundus_fedavg_Domain1_seed1", "fundus_fedavg_Domain2_seed1"]
    assert "1 cell(s) left for a machine of their seed's CPU family (seed 0 on AMD avx2): this sweep makes AMD " \
           "avx2-pinned runs, and a pair's two runs must come from one family" in lines, lines


def test_a_sweep_left_nothing_by_the_seeds_families_names_the_first_seed_no_family_holds(tmp_path, monkeypatch):
    """On a machine whose family holds none of the seeds asked for, the sweep runs nothing and says which seed it
    can make instead (seeds 0 and 1 held by two families, 3 by the second: the first free one is 2)."""
    from feddg.benchmark import sweep as sweep_module

    out, lines, ran = tmp_path / "held", [], []
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="AMD EPYC 7B13", avx512=False)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="Intel(R) Xeon(R) Processor", avx512=True)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1"], [1, 3], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "old-code", ran=ran, cpu="AMD EPYC", avx512=True)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain2"], [0, 1], report=lines.append)
    assert ran == []
    assert "2 cell(s) left for a machine of their seed's CPU family (seed 0 on AMD avx2; seed 1 on Intel " \
           "native-avx512): this sweep makes AMD native-avx512 runs, and a pair's two runs must come from one " \
           "family; a seed no family holds yet can be made here (the first: 2)" in lines, lines


def test_a_machine_of_another_cpu_generation_does_not_join_the_seeds_of_one_whose_generation_was_not_recorded(
        tmp_path, monkeypatch):
    """Two AMD EPYC machines without AVX-512 gave other numbers for one prostate cell from its first round on, with
    either code (docs/benchmark.md): a machine that records its CPU's signature (generation and caches) leaves a
    seed made by runs without one to that machine, makes the first seed no family holds, and a second machine of
    the same signature joins that seed; a machine of another generation joins it only when listed in
    :data:`feddg.numerics.SAME_NUMBERS` (measured to repeat its whole runs)."""
    from feddg.benchmark import sweep as sweep_module
    from feddg.benchmark.record import run_records, seed_families

    out, lines, ran = tmp_path / "set", [], []
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="AMD EPYC", avx512=False)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    zen2 = "23/49 L1d 32K L2 512K L3 16M"
    _fake_executor(monkeypatch, sweep_module, "old-code", ran=ran, cpu="AMD EPYC", avx512=False, signature=zen2)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain2"], [0], report=lines.append)
    assert [r for r, _ in ran] == [], "seed 0 is the unsigned machine's"
    assert f"1 cell(s) left for a machine of their seed's CPU family (seed 0 on AMD avx2): this sweep makes AMD " \
           f"avx2 [{zen2}] runs, and a pair's two runs must come from one family; a seed no family holds yet can " \
           f"be made here (the first: 1)" in lines, lines
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1", "Domain2"], [1], report=lambda _: None)
    unlisted = "25/8 L1d 32K L2 512K L3 64M"
    assert unlisted not in SAME_NUMBERS, "a generation measured to repeat no family's runs"
    _fake_executor(monkeypatch, sweep_module, "old-code", ran=ran, cpu="AMD EPYC", avx512=False, signature=unlisted)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain3"], [1], report=lambda _: None)
    assert [r for r, _ in ran] == ["fundus_fedavg_Domain1_seed1", "fundus_fedavg_Domain2_seed1"]
    assert seed_families(run_records(out).values()) == {0: "AMD avx2", 1: f"AMD avx2 [{zen2}]"}

    joined = next(signature for signature, family in SAME_NUMBERS.items() if family == zen2)
    _fake_executor(monkeypatch, sweep_module, "old-code", ran=ran, cpu="AMD EPYC", avx512=False, signature=joined)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain3"], [1], report=lambda _: None)
    assert [r for r, _ in ran][2:] == ["fundus_fedavg_Domain3_seed1"], "a generation measured to repeat it joins"
    assert seed_families(run_records(out).values()) == {0: "AMD avx2", 1: f"AMD avx2 [{zen2}]"}


def test_a_cpu_timeline_window_gives_its_signature_to_the_runs_that_predate_it(tmp_path):
    """Runs made before runs recorded their CPU's signature take it from the folder's timeline window that holds
    them, when the window's CPU maker and AVX-512 agree with the run's; a window that holds a run of another CPU is
    refused naming the run."""
    import json

    from feddg.benchmark.record import run_family, run_records

    def record(name: str, ended_at: float, cpu: str, avx512: bool) -> None:
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({
            "run": {"task": "fundus", "method": "fedavg", "held_out": "Domain1", "seed": 0}, "run_id": name,
            "status": "ok", "wall_s": 1.0, "config": {}, "ended_at": ended_at,
            "executor": {"cpu": cpu, "avx512": avx512}}))

    record("old", 10.0, "AMD EPYC", False)
    record("today", 60.0, "AMD EPYC", False)
    record("intel", 90.0, "Intel Xeon", True)
    windows = [{"cpu": "AMD EPYC", "avx512": False, "signature": "23/49 L3 16M", "from": 50, "until": 70},
               {"cpu": "AMD EPYC", "avx512": False, "until": 50}]
    (tmp_path / "cpu_timeline.json").write_text(json.dumps({"source": "a test", "windows": windows}))
    families = {name: run_family(r) for name, r in run_records(tmp_path).items()}
    assert families == {"old": "AMD avx2", "today": "AMD avx2 [23/49 L3 16M]", "intel": "Intel native-avx512"}

    windows[0]["until"] = 100
    (tmp_path / "cpu_timeline.json").write_text(json.dumps({"source": "a test", "windows": windows}))
    with pytest.raises(ConfigError, match=r"the window of CPU signature '23/49 L3 16M' \(AMD EPYC, avx512 False\) "
                                          r"holds runs/intel, made on Intel Xeon \(avx512 True\): narrow the window"):
        run_records(tmp_path)


def test_each_seed_stays_on_one_cpu_family_and_the_reproduce_check_re_runs_a_run_of_this_family(
        tmp_path, monkeypatch):
    """A run repeats only on its CPU family (maker and kernels; an Intel Xeon re-running AMD EPYC runs of the same
    code differed in 173 of 204 per-case scores): on an Intel machine a sweep leaves the cells of a seed made on AMD
    to an AMD machine, saying so, runs the seeds no family holds yet, and its reproduce check re-runs a run of its
    own family (seed 0 where there is one); with none of its family, the check is refused naming the method."""
    import json

    from feddg.benchmark import sweep as sweep_module

    out, lines = tmp_path / "mixed", []
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="AMD EPYC 7B13", avx512=False)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    ran: list = []
    _fake_executor(monkeypatch, sweep_module, "old-code", ran=ran, cpu="Intel(R) Xeon(R) Processor", avx512=True)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1", "Domain2"], [0, 1], report=lines.append)
    assert [r for r, _ in ran] == ["fundus_fedavg_Domain1_seed1", "fundus_fedavg_Domain2_seed1"]
    assert "1 cell(s) left for a machine of their seed's CPU family (seed 0 on AMD avx2): this sweep makes Intel " \
           "native-avx512 runs, and a pair's two runs must come from one family" in lines, lines
    assert any(line.startswith("4 runs, 1 done before, 1 left for another machine, 2 to run") for line in lines), lines

    ran.clear()
    _fake_executor(monkeypatch, sweep_module, "new-code", ran=ran, cpu="Intel(R) Xeon(R) Processor", avx512=True)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1", "Domain2"], [0, 1, 2], reproduce_check=True,
                       report=lambda _: None)
    assert ran[0] == ("fundus_fedavg_Domain1_seed1", REPRODUCE_DIR), "of this family, not seed 0"
    (check,) = json.loads((out / "sweep.json").read_text())["code_evidence"]
    assert check["family"] == "Intel native-avx512" and check["methods"][0]["family"] == "Intel native-avx512"

    amd_only = tmp_path / "amd_only"
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="AMD EPYC 7B13", avx512=False)
    sweep_module.sweep(amd_only, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "new-code", cpu="Intel(R) Xeon(R) Processor", avx512=True)
    with pytest.raises(ConfigError, match=r"fedavg has none \(its runs: AMD avx2\): run the check on a machine of "
                                          r"that family"):
        sweep_module.sweep(amd_only, Protocol("fundus"), ["fedavg"], ["Domain1"], [0, 1], reproduce_check=True,
                           report=lambda _: None)


def test_a_code_checked_on_one_family_needs_a_check_on_each_family_whose_runs_other_code_made(
        tmp_path, monkeypatch):
    """Seed 0 is AMD avx2's (old code), seed 1 the Intel Xeon's. New code checked on the Intel Xeon is admitted
    there; on the AMD machine, beside its old-code runs, it is refused until a check there: that check re-runs the
    methods with AMD runs of other code (not uniform, whose only runs are the new code's, on Intel). A family the
    folder has no run of takes the admitted code without a check."""
    import json

    from feddg.benchmark import sweep as sweep_module

    intel, amd, amd512 = ("Intel(R) Xeon(R) Processor", True), ("AMD EPYC 7B13", False), ("AMD EPYC", True)
    out, protocol = tmp_path / "set", Protocol("fundus")
    _fake_executor(monkeypatch, sweep_module, "old-code", (0.8, 0.6), None, *amd)
    sweep_module.sweep(out, protocol, ["fedavg", "ga"], ["Domain1"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "old-code", (0.8, 0.6), None, *intel)
    sweep_module.sweep(out, protocol, ["fedavg", "ga"], ["Domain1"], [1], report=lambda _: None)
    ran: list = []
    _fake_executor(monkeypatch, sweep_module, "new-code", (0.8, 0.6), ran, *intel)
    sweep_module.sweep(out, protocol, ["fedavg", "ga", "uniform"], ["Domain1"], [1], reproduce_check=True,
                       report=lambda _: None)
    assert ran == [("fundus_fedavg_Domain1_seed1", REPRODUCE_DIR), ("fundus_ga_Domain1_seed1", REPRODUCE_DIR),
                   ("fundus_uniform_Domain1_seed1", "set")]
    records = sweep_module.run_records(out)
    assert admitted_codes(out, records, "Intel native-avx512") == {"new-code"}
    assert admitted_codes(out, records, "AMD avx2") == {"old-code"}  # its runs' one code
    assert admitted_codes(out, records, "AMD native-avx512") == admitted_codes(out, records) == {"old-code",
                                                                                                 "new-code"}

    ran.clear()
    _fake_executor(monkeypatch, sweep_module, "new-code", (0.8, 0.6), ran, *amd)
    with pytest.raises(ConfigError, match=r"this code \(new-code\) has no check on this machine's CPU family "
                                          r"\(AMD avx2\), whose runs there were made by code old-code\..*"
                                          r"--reproduce-check"):
        sweep_module.sweep(out, protocol, ["fedavg"], ["Domain2"], [0], report=lambda _: None)
    sweep_module.sweep(out, protocol, ["fedavg"], ["Domain2"], [0], reproduce_check=True, report=lambda _: None)
    assert ran == [("fundus_fedavg_Domain1_seed0", REPRODUCE_DIR), ("fundus_ga_Domain1_seed0", REPRODUCE_DIR),
                   ("fundus_fedavg_Domain2_seed0", "set")]
    check = json.loads((out / "sweep.json").read_text())["code_evidence"][-1]
    assert (check["family"], check["admitted"], [m["method"] for m in check["methods"]]) == (
        "AMD avx2", True, ["fedavg", "ga"])
    # two codes among AMD avx2's runs now: the check, not the runs, is what admits a code there
    assert admitted_codes(out, sweep_module.run_records(out), "AMD avx2") == {"new-code"}

    ran.clear()
    _fake_executor(monkeypatch, sweep_module, "new-code", (0.8, 0.6), ran, *amd512)
    sweep_module.sweep(out, protocol, ["fedavg"], ["Domain1"], [2], reproduce_check=True, report=lambda _: None)
    assert ran == [("fundus_fedavg_Domain1_seed2", "set")]  # a family new to the folder: nothing to re-run


def test_runs_that_joined_a_family_without_a_check_do_not_admit_their_code_there(tmp_path, monkeypatch):
    """A family whose runs come from two codes with no check on it admits neither: a sweep there re-runs an old
    code's run first, never one of the code being checked."""
    import shutil

    from feddg.benchmark import sweep as sweep_module
    from feddg.benchmark.reproduce import reproduce_cells

    amd = ("AMD EPYC 7B13", False)
    out, protocol = tmp_path / "set", Protocol("fundus")
    _fake_executor(monkeypatch, sweep_module, "old-code", (0.8, 0.6), None, *amd)
    sweep_module.sweep(out, protocol, ["fedavg"], ["Domain2"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "new-code", (0.8, 0.6), None, *amd)
    sweep_module.sweep(tmp_path / "other", protocol, ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    shutil.move(tmp_path / "other" / "runs" / "fundus_fedavg_Domain1_seed0", out / "runs")  # joined with no check
    records = sweep_module.run_records(out)
    assert admitted_codes(out, records, "AMD avx2") == set()
    chosen = reproduce_cells(out, records, protocol, "AMD avx2", "new-code")
    assert chosen["fedavg"]["run_id"] == "fundus_fedavg_Domain2_seed0"  # the old code's, not Domain1 (the new's)


def test_a_run_moved_aside_for_its_seeds_family_serves_the_reproduce_check_of_its_own(tmp_path, monkeypatch):
    """Seed 0 is AMD's; an Intel run of it, moved to aside/, is the only run the Intel machine can repeat: its
    reproduce check re-runs that one (it still measures its code)."""
    import shutil

    from feddg.benchmark import sweep as sweep_module

    out, other = tmp_path / "set", tmp_path / "intel_made"
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="AMD EPYC 7B13", avx512=False)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1", "Domain2"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "old-code", cpu="Intel(R) Xeon(R) Processor", avx512=True)
    sweep_module.sweep(other, Protocol("fundus"), ["fedavg"], ["Domain3"], [0], report=lambda _: None)
    (out / "aside").mkdir()
    shutil.move(str(other / "runs" / "fundus_fedavg_Domain3_seed0"), out / "aside")
    ran: list = []
    _fake_executor(monkeypatch, sweep_module, "new-code", ran=ran, cpu="Intel(R) Xeon(R) Processor", avx512=True)
    sweep_module.sweep(out, Protocol("fundus"), ["fedavg"], ["Domain1"], [0, 1], reproduce_check=True,
                       report=lambda _: None)
    assert ran == [("fundus_fedavg_Domain3_seed0", REPRODUCE_DIR), ("fundus_fedavg_Domain1_seed1", "set")]


def test_a_run_of_another_family_than_its_seeds_is_refused_and_moved_aside(tmp_path):
    """Seed 0's runs are AMD; an Intel run at seed 0 would pair across makers: refused naming it, moved with
    --move-aside-mismatched; an Intel run at seed 1 (a seed of its own) stays."""
    from feddg.benchmark.protocol import run_experiment
    from feddg.benchmark.record import check_records, seed_families

    protocol = Protocol("fundus", {"train": {"rounds": 2, "local_epochs": 1}})
    made = {("Domain1", 0): ("AMD EPYC", False), ("Domain2", 0): ("AMD EPYC", False),
            ("Domain3", 0): ("Intel Xeon", True), ("Domain1", 1): ("Intel Xeon", True)}
    for (site, seed), (cpu, avx512) in made.items():
        run = Run("fundus", "fedavg", site, seed)
        folder = tmp_path / "runs" / run.run_id
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({
            "run": run.__dict__, "run_id": run.run_id, "status": "ok", "wall_s": 1.0, "cpu_pin": "off",
            "config": run_experiment(protocol, run), "simulator_args": [],
            "executor": {"cpu": cpu, "avx512": avx512}}))
    from feddg.benchmark.record import run_records

    assert seed_families(run_records(tmp_path).values()) == {0: "AMD avx2", 1: "Intel native-avx512"}
    with pytest.raises(ConfigError, match=r"fundus_fedavg_Domain3_seed0: made on Intel native-avx512 \(cpu_pin 'off' "
                                          r"on Intel Xeon\), while seed 0's runs are AMD avx2"):
        check_records(tmp_path, protocol)
    check_records(tmp_path, protocol, move_aside=True, report=lambda _: None)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "fundus_fedavg_Domain1_seed0", "fundus_fedavg_Domain1_seed1", "fundus_fedavg_Domain2_seed0"]
    assert (tmp_path / "aside" / "fundus_fedavg_Domain3_seed0" / "run.json").exists()


def test_the_reproduce_check_runs_every_method_and_names_the_one_that_changed(tmp_path, monkeypatch):
    """A change that touches one method's code path (GA's aggregation) is caught by that method's own cell: the check
    re-runs seed 0 of every method the folder holds and refuses naming the method and case that differ."""
    import json

    from feddg.benchmark import sweep as sweep_module
    from feddg.report import code_fingerprint

    old = {"fedavg": (0.8, 0.6), "ga": (0.7, 0.5)}
    _fake_executor(monkeypatch, sweep_module, "old-code", scores=old)
    sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg", "ga"], ["Domain1", "Domain2"], [0, 1],
                       report=lambda _: None)
    ran: list = []
    _fake_executor(monkeypatch, sweep_module, code_fingerprint(), ran=ran, scores={**old, "ga": (0.7, 0.51)})
    with pytest.raises(ConfigError, match=r"reproduce check: ga \(fundus_ga_Domain1_seed0\) gives other per-case "
                                          r"scores .*final.Domain1.test.1.cup.dice: 0.5 with the old code, 0.51"):
        sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg", "ga"], ["Domain1", "Domain2"], [0, 1, 2],
                           reproduce_check=True, report=lambda _: None)
    assert sorted(ran) == [("fundus_fedavg_Domain1_seed0", REPRODUCE_DIR),
                           ("fundus_ga_Domain1_seed0", REPRODUCE_DIR)]  # one cell per method, no new run
    (check,) = json.loads((tmp_path / "sweep.json").read_text())["code_evidence"]
    assert check["admitted"] is False
    assert {m["method"]: m["identical"] for m in check["methods"]} == {"fedavg": True, "ga": False}
    assert admitted_codes(tmp_path, sweep_module.run_records(tmp_path)) == {"old-code"}


def test_a_reproduce_check_needs_a_run_of_every_method_on_this_family_and_runs_nothing_without_it(
        tmp_path, monkeypatch):
    """fedavg has a run made here (Intel), GA only one made on AMD: with new code on Intel the check cannot prove
    GA's code, so it is refused naming GA and the families, before anything runs or is written."""
    import json

    from feddg.benchmark import sweep as sweep_module

    intel, amd = ("Intel(R) Xeon(R) Processor", True), ("AMD EPYC 7B13", False)
    _fake_executor(monkeypatch, sweep_module, "old-code", (0.8, 0.6), None, *intel)
    sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg"], ["Domain1"], [0], report=lambda _: None)
    _fake_executor(monkeypatch, sweep_module, "old-code", (0.8, 0.6), None, *amd)
    sweep_module.sweep(tmp_path, Protocol("fundus"), ["ga"], ["Domain1"], [1], report=lambda _: None)
    before = (tmp_path / "sweep.json").read_text()
    ran: list = []
    _fake_executor(monkeypatch, sweep_module, "new-code", (0.8, 0.6), ran, *intel)
    with pytest.raises(ConfigError, match=r"this machine's CPU family \(Intel native-avx512\), and ga has none "
                                          r"\(its runs: AMD avx2\)"):
        sweep_module.sweep(tmp_path, Protocol("fundus"), ["fedavg"], ["Domain1"], [0, 2], reproduce_check=True,
                           report=lambda _: None)
    assert ran == [] and json.loads((tmp_path / "sweep.json").read_text()) == json.loads(before)


def test_the_plan_prints_its_machine_time_and_a_dry_run_runs_nothing(tmp_path, monkeypatch):
    from feddg.benchmark import sweep as sweep_module

    ran, lines = [], []
    _fake_executor(monkeypatch, sweep_module, "c", ran=ran)
    monkeypatch.setattr(sweep_module, "PILOT_SECONDS_PER_ROUND", {"fundus": 2.0})
    sweep_module.sweep(tmp_path / "new", Protocol("fundus", {"train": {"rounds": 30}}), ["fedavg", "uniform"],
                       ["Domain1", "Domain2"], [0, 1, 2], dry_run=True, report=lines.append)
    assert ran == [] and not (tmp_path / "new").exists()
    # 12 runs x 30 rounds x 2 s = 720 s = 0.2 h
    assert lines == ["12 runs, 0 done before, 12 to run: about 0.2 run-hours (60 s per run: the pilot's "
                     "2.0 s per FedAvg round on a 2-core CPU x 30 rounds; methods with heavier local training take "
                     "longer; runs made at once share the wall time)"]


def test_the_plan_counts_each_methods_own_run_time_on_this_cpu_family_from_the_whole_folder():
    """A sweep of new cells learns from the folder's other runs: each method's mean wall time on this machine's
    numbers family, else on any, else the folder's mean; a failed run's time is not a run's time."""
    from feddg.benchmark.sweep import estimate

    def made(method: str, wall: float, cpu: str, avx512: bool, status: str = "ok") -> dict:
        return {"status": status, "wall_s": wall, "run": {"method": method},
                "executor": {"cpu": cpu, "avx512": avx512}}

    intel, amd = "Intel(R) Xeon(R) Processor", "AMD EPYC 7B13"
    folder = {"a": made("fedavg", 1500, intel, True), "b": made("fedavg", 1600, intel, True),
              "c": made("fedavg", 900, amd, False), "d": made("elcfs", 5000, amd, False),
              "e": made("elcfs", 10, intel, True, status="failed")}
    todo = [Run("prostate", m, "UCL", k) for m in ("fedavg", "elcfs", "ga") for k in (3, 4)]
    seconds, source = estimate(Protocol("prostate"), folder, todo, "Intel native-avx512")
    # fedavg 1550 (its 2 Intel runs), elcfs 5000 (its AMD run: none on Intel), ga 2250 (no ga run: the mean of 4)
    assert seconds == pytest.approx(2 * (1550 + 5000 + 2250))
    assert source == ("each method's mean over the folder's finished runs: fedavg 1550 s (2 on Intel native-avx512), "
                      "elcfs 5000 s (1 on any CPU), ga 2250 s (no run of it: the folder's mean over 4)")
    assert estimate(Protocol("prostate"), folder, [], "Intel native-avx512") == (0.0, "nothing to run")


# -- the tables with seeds as the unit -----------------------------------------------------------------------------


def _prostate_record(method: str, site: str, seed: int, scores) -> dict:
    from feddg.experiment import TASK_DEFAULTS

    cases = {str(i): {"prostate": {"dice": float(s)}} for i, s in enumerate(scores)}
    test = {"prostate": {"dice": {"mean": float(np.mean(scores)), "std": float(np.std(scores))},
                         "hd95": {"mean": 3.0, "std": 0.0}, "asd": {"mean": 1.0, "std": 0.0},
                         "n_cases": len(scores)}, "cases": cases}
    return {"status": "ok", "run_id": f"prostate_{method}_{site}_seed{seed}", "wall_s": 60.0,
            "run": {"task": "prostate", "method": method, "held_out": site, "seed": seed},
            "config": copy.deepcopy(TASK_DEFAULTS["prostate"]),
            "report": {"models": {"final": {"sites": {site: {"splits": {"test": test}}}}}}}


def _design(shift: dict[str, float], seeds=(0, 1, 2), sites=("BMC", "HK")) -> list[dict]:
    """fedavg, uniform and the methods of ``shift`` (method -> its effect on every case) at every site and seed;
    each seed moves every method of that seed alike (retraining), the cases differ."""
    records = []
    for site in sites:
        for seed in seeds:
            base = 0.5 + 0.05 * np.sin(seed + len(site)) + np.array([0.0, 0.1, -0.1, 0.05])
            for method, effect in {"fedavg": 0.0, "uniform": 0.001, **shift}.items():
                wobble = 0.004 * np.cos(3 * seed + len(method))
                records.append(_prostate_record(method, site, seed, base + effect + wobble))
    return records


def test_each_baseline_gets_its_difference_table_and_the_verdicts_follow_the_results():
    from feddg.benchmark.tables import comparisons, markdown

    def tables(effect: float, seeds=(0, 1, 2, 3, 4)) -> str:
        records = _design({"ga": effect}, seeds)
        stats = [comparisons(records, b, ["BMC", "HK"], n_resamples=500) for b in ("fedavg", "uniform")]
        return markdown(records, stats, ["fedavg", "uniform", "ga"], ["BMC", "HK"])

    big, none, few = tables(0.2), tables(0.0), tables(0.2, (0, 1, 2))
    assert "### Dice difference to fedavg" in big and "### Dice difference to uniform" in big
    # 5 seeds, the seed as the unit: a paired t-test over the seeds' site averages, Holm over the 2 methods
    assert "**ga** vs fedavg: +0.19" in big and "ahead at 2 of 2 sites; paired t over the 5 seeds' site averages" in big
    assert "ahead of fedavg on the average, on these 2 held-out sites (synthetic data)" in big
    assert "**ga** vs fedavg: " in none and "not resolved at 5 seeds, on these 2 held-out sites" in none
    assert "ahead of" not in none.split("**ga** vs fedavg")[1].split("\n")[0]
    # 3 seeds: the t-test resolves a large, consistent difference; the sign-flip check beside it cannot (floor 0.25)
    assert "ahead of fedavg on the average" in few and "sign-flip p 0.250, its floor 0.25)" in few
    # a per-site cell: interval, seed count, SD of the paired differences
    row = next(line for line in big.splitlines() if line.startswith("| ga | +0.19"))
    assert "5 seeds, SD" in row and "[" in row


def test_a_cell_with_fewer_than_three_seeds_shows_its_seed_differences_and_no_interval():
    from feddg.benchmark.tables import comparisons, markdown, verdict

    records = _design({"ga": 0.05}, seeds=(0, 1))
    stats = comparisons(records, "fedavg", ["BMC", "HK"], n_resamples=500)
    text = markdown(records, [stats], ["fedavg", "uniform", "ga"], ["BMC", "HK"])
    row = next(line for line in text.splitlines() if line.startswith("| ga | +0.0"))
    assert "+0.050 (2 seeds: +0.044, +0.055)" in row and "[" not in row
    average = stats["methods"]["ga"]["average"]  # seeds 0 and 1 at both sites: their site averages, D_0 and D_1
    assert row.endswith(f"| {average.mean:+.3f} (seeds 0-1, run at every site: {average.tested[0]:+.3f}, "
                        f"{average.tested[1]:+.3f}) | - |")
    assert average.mean == pytest.approx(np.mean(list(average.tested.values())))
    assert "not resolved, fewer than 3 seeds run at every site" in verdict("ga", stats["methods"]["ga"], "fedavg", 2)
    assert "holm_p" not in stats["methods"]["ga"]


def test_an_average_too_few_seeds_to_test_still_counts_in_the_holm_family_its_power_is_stated_for():
    """GA's prostate average once had one seed (seed 5, run at every site) beside uniform's three: the power line said
    "after Holm over 2" while uniform's Holm p was its unadjusted t p. One family for both: the untested average
    counts as not rejected, so the tested one's p is doubled."""
    from feddg.benchmark.tables import comparisons, verdict

    records = [r for r in _design({"ga": 0.05}) if r["run"]["method"] != "ga" or r["run"]["seed"] == 0]
    stats = comparisons(records, "fedavg", ["BMC", "HK"], n_resamples=500)
    uniform = stats["methods"]["uniform"]
    assert stats["family"] == 2 and "holm_p" not in stats["methods"]["ga"]
    assert uniform["average"].p.value < 0.5
    assert uniform["holm_p"].value == pytest.approx(2 * uniform["average"].p.value)
    line = verdict("uniform", uniform, "fedavg", 2, family=stats["family"])
    assert f"Holm p {uniform['holm_p'].format()}" in line


def test_a_method_run_at_some_held_out_sites_only_has_no_average():
    from feddg.benchmark.tables import comparisons, verdict

    records = [r for r in _design({"ga": 0.05}) if not (r["run"]["method"] == "ga" and r["run"]["held_out"] == "HK")]
    stats = comparisons(records, "fedavg", ["BMC", "HK"], n_resamples=500)
    assert "average" not in stats["methods"]["ga"]
    bmc = stats["methods"]["ga"]["sites"]["BMC"]
    assert verdict("ga", stats["methods"]["ga"], "fedavg", 2) == (
        f"**ga** vs fedavg: compared at 1 of 2 held-out sites only, no average: BMC {bmc.format()}, paired t p "
        f"{bmc.p.format()} (not Holm-adjusted).")
    assert bmc.mean == pytest.approx(0.05, abs=0.005) and bmc.p.kind == "t"
    assert bmc.flip_p.value == pytest.approx(0.25)  # 3 seeds, all > 0: 2/8


def test_a_method_run_at_every_site_with_no_seed_common_to_all_has_no_average(tmp_path):
    """GA's prostate set once held RUNMC at seed 4 only and UCL at seed 5 only: every site compared, no seed run at
    all of them. Each site keeps its column, the average is left out of the test and of the Holm family, and the
    results are written."""
    from feddg.benchmark.record import RUN_FILE
    from feddg.benchmark.results import write_results
    from feddg.benchmark.tables import comparisons, verdict

    records = [r for r in _design({"ga": 0.05, "fedprox": 0.02}) if not (
        r["run"]["method"] == "ga" and (r["run"]["held_out"], r["run"]["seed"]) not in
        {("BMC", 0), ("BMC", 1), ("HK", 2)})]
    stats = comparisons(records, "fedavg", ["BMC", "HK"], n_resamples=500)
    ga = stats["methods"]["ga"]
    assert "average" not in ga and "holm_p" not in ga and sorted(ga["sites"]) == ["BMC", "HK"]
    assert "average" in stats["methods"]["fedprox"] and stats["family"] == 2  # fedprox and uniform only
    bmc, hk = ga["sites"]["BMC"], ga["sites"]["HK"]
    assert verdict("ga", ga, "fedavg", 2) == (
        f"**ga** vs fedavg: compared at every one of the 2 held-out sites, but no seed was run at all of them, so no "
        f"average: BMC {bmc.format()}; HK {hk.format()}.")
    for record in records:
        folder = tmp_path / "runs" / record["run_id"]
        folder.mkdir(parents=True)
        (folder / RUN_FILE).write_text(json.dumps(record))
    write_results(tmp_path, ["fedavg", "uniform", "fedprox", "ga"], ["BMC", "HK"], n_resamples=200)
    text = (tmp_path / "results.md").read_text()
    assert "compared at every one of the 2 held-out sites, but no seed was run at all of them" in text
    ga_row = next(line for line in text.splitlines() if line.startswith("| ga | "))
    assert ga_row.endswith("| - |")  # the Dice table's average cell: no seed in common


def test_the_average_column_keeps_to_the_seeds_run_at_every_site_and_names_them():
    """Five seeds at BMC and two at HK (a folder made a part at a time): the average is over seeds 3 and 4, the
    seeds its test pairs, not the mean of a 5-seed and a 2-seed cell."""
    from feddg.benchmark.scores import cells
    from feddg.benchmark.tables import comparisons, markdown, site_average

    records = [_prostate_record("fedavg", "BMC", k, [0.1 * k]) for k in range(5)] + [
        _prostate_record("fedavg", "HK", k, [0.5 + 0.1 * k]) for k in (3, 4)] + [
        _prostate_record("uniform", site, k, [0.2]) for site in ("BMC", "HK") for k in (3, 4)]
    table = cells(records)
    # seed 3: (0.3 + 0.8) / 2 = 0.55; seed 4: (0.4 + 0.9) / 2 = 0.65; mean 0.60 (the cells' means would give 0.525)
    value, seeds = site_average(table, "fedavg", ["BMC", "HK"], ("prostate", "dice"))
    assert seeds == [3, 4] and value == pytest.approx(0.60)
    records[0] = _prostate_record("fedavg", "BMC", 0, [0.9])  # seed 0 at BMC only moves the cells' mean, not this
    assert site_average(cells(records), "fedavg", ["BMC", "HK"], ("prostate", "dice")) == (pytest.approx(0.60), [3, 4])
    assert site_average(table, "fedavg", ["BMC", "HK", "UCL"], ("prostate", "dice")) == (None, [])
    only_bmc = [r for r in records if r["run"]["held_out"] == "BMC" or r["run"]["seed"] != 4]
    assert site_average(cells(only_bmc), "uniform", ["BMC", "HK"], ("prostate", "dice")) == (pytest.approx(0.2), [3])
    dice = markdown(records, [comparisons(records, "fedavg", ["BMC", "HK"], n_resamples=200)], ["fedavg", "uniform"],
                    ["BMC", "HK"]).split("### Dice, prostate", 1)[1].split("###", 1)[0]
    assert next(line for line in dice.splitlines() if line.startswith("| fedavg |")).endswith(
        "| 0.600 (seeds 3-4) |")
    assert next(line for line in dice.splitlines() if line.startswith("| uniform |")).endswith("| 0.200 |"), \
        "every cell has the same seeds: the plain mean"


def test_the_tables_show_every_designed_cell_and_average_only_a_complete_row(tmp_path):
    """A folder made a part at a time: the design (every cell its sweeps asked for) fixes rows and columns; a cell
    not run yet says so, a method without every designed site has no average, a method never run says so, and the
    header counts the finished runs against the design."""
    import json

    from feddg.benchmark.record import designed, record_design
    from feddg.benchmark.results import write_results

    for record in _design({"ga": 0.05}, sites=("BMC",)):
        folder = tmp_path / "runs" / record["run_id"]
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(record))
    (tmp_path / "sweep.json").write_text(json.dumps({"task": "prostate", "overrides": {}, "simulator_args": []}))
    assert designed(tmp_path) == {}
    record_design(tmp_path, ["fedavg", "uniform", "ga"], ["HK"], [0, 1, 2])  # the runs made before count too
    record_design(tmp_path, ["elcfs"], ["HK"], [0, 1, 2])
    assert designed(tmp_path) == {m: {"BMC": [0, 1, 2], "HK": [0, 1, 2]} for m in ("fedavg", "uniform", "ga")} | {
        "elcfs": {"HK": [0, 1, 2]}}
    assert json.loads((tmp_path / "sweep.json").read_text())["task"] == "prostate", "the protocol is kept"
    write_results(tmp_path, ["fedavg", "uniform", "ga", "elcfs"], ["BMC", "HK"], n_resamples=200)
    text = (tmp_path / "results.md").read_text()
    assert "9 of 9 recorded runs finished; 9 of the 21 runs the folder's sweeps asked for (" in text
    dice = text.split("### Dice, prostate", 1)[1].split("###", 1)[0]
    assert "| method | BMC | HK | average |" in dice
    assert "| elcfs | not run | not run | - |" in dice
    fedavg_row = next(line for line in dice.splitlines() if line.startswith("| fedavg |"))
    assert fedavg_row.endswith("| not run | - |"), "no average over the sites run so far"
    assert "- **elcfs**: not run yet." in text
    assert "**ga** vs fedavg: compared at 1 of 2 held-out sites only, no average: BMC +0.0" in text


def test_write_results_reports_machine_time_the_code_of_the_runs_and_the_paper_size_cost(tmp_path):
    import json

    from feddg.benchmark.results import write_results

    for i, record in enumerate(_design({"ga": 0.1})):
        record["code"] = "abc123"
        if i % 3:  # runs made on two CPU models, one in three from before runs recorded theirs
            record["executor"] = {"executor": "local", "cpu": "AMD EPYC 7B13" if i % 3 == 1 else "CPU B",
                                  "avx512": i % 3 == 2}
        folder = tmp_path / "runs" / record["run_id"]
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(record))
    (tmp_path / "sweep.json").write_text(json.dumps({"task": "prostate", "overrides": {}, "simulator_args": []}))
    write_results(tmp_path, ["fedavg", "uniform", "ga"], ["BMC", "HK"], n_resamples=200)
    text = (tmp_path / "results.md").read_text()
    # 18 runs of 60 s, one at a time (nothing recorded says otherwise): 0.3 hours, 60 runs per hour
    # the numbers family is the maker (the model where no maker is known) and the kernels; six runs recorded no CPU
    assert ("code abc123 (18 runs); CPU AMD EPYC 7B13 (6 runs), CPU B (6 runs), not recorded (6 runs); numbers family "
            "AMD avx2 (6 runs; seeds 0-2), CPU B native-avx512 (6 runs; seeds 0-2), unknown (6 runs; seeds "
            "0-2)); 0.3 hours of wall time (runs at once counted once; 0.3 run-hours), 60.0 runs per hour") in text, \
        text[:600]
    assert "cannot be compared with the papers' numbers" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["machine_time"]["runs_by_executor"] == {"local": 12, "unrecorded": 6}, "before executors were kept"
    assert saved["runs_by_cpu"] == {"AMD EPYC 7B13": 6, "CPU B": 6, "not recorded": 6}
    assert saved["runs_by_family"] == {"AMD avx2": {"runs": 6, "seeds": [0, 1, 2]},
                                       "CPU B native-avx512": {"runs": 6, "seeds": [0, 1, 2]},
                                       "unknown": {"runs": 6, "seeds": [0, 1, 2]}}
    assert saved["machine_time"]["runs"] == 18 and set(saved["comparisons"]) == {"fedavg", "uniform"}
    assert saved["comparisons"]["fedavg"]["ga"]["verdict"].startswith("**ga** vs fedavg")
    assert saved["paper_size"]["design_runs"] == 240 and saved["paper_size"]["hours"] is None
    assert "The full design at the papers' size (240 runs" in text and "cost not measured" in text
    (tmp_path / "paper_round_time.json").write_text(json.dumps({  # benchmarks/round_time.py --paper on a GPU
        "command": "round_time.py --paper", "machine": {"cpu": "X", "cores": 16, "gpu": "GPU G"}, "job": "prostate_ga",
        "paper": True, "federated_summary": {"round_s": 9.0}}))
    write_results(tmp_path, ["fedavg", "uniform", "ga"], ["BMC", "HK"], n_resamples=200)
    assert json.loads((tmp_path / "results.json").read_text())["paper_size"]["hours"] == 60.0  # 240 x 100 x 9 s
    assert "60 GPU-hours on GPU G" in (tmp_path / "results.md").read_text()


def test_the_verdicts_open_with_the_runs_the_seeds_the_seed_sd_and_the_machine_time():
    """The front page quotes only the generated verdicts: they say themselves what they rest on and cost."""
    from feddg.benchmark.readme import verdicts
    from feddg.benchmark.tables import comparisons, markdown

    records = []
    for site, values in {"BMC": [0.5, 0.6, 0.7], "HK": [0.4, 0.4, 0.4]}.items():  # seed variances 0.01 and 0
        for seed, value in enumerate(values):
            for method, effect in (("fedavg", 0.0), ("ga", 0.02)):
                records.append(_prostate_record(method, site, seed, [value + effect] * 4))
    records.append({**_prostate_record("ga", "HK", 3, [0.5] * 4), "wall_s": 240.0})  # one cell with 4 seeds
    stats = [comparisons(records, "fedavg", ["BMC", "HK"], n_resamples=200)]
    quoted = verdicts(markdown(records, stats, ["fedavg", "ga"], ["BMC", "HK"]))
    # 13 runs, one at a time: 12 x 60 s + 240 s = 0.27 hours, 48.75 runs per hour; pooled SD: the root of the
    # mean of the 4 cells' variances (0.01, 0.01, 0, and HK ga's 0.0016 over its 4 seeds), sqrt(0.0054) = 0.073
    assert quoted.startswith(
        "From 13 finished runs, 3-4 seeds per cell; how far retraining alone moves one run's held-out Dice: a pooled "
        "seed SD of 0.073 (over 4 cells). The folder's 13 recorded runs took 0.3 hours of wall time (runs at once "
        "counted once; 0.3 run-hours), 48.8 runs per hour (run by unrecorded: 13).\n\nSeeds finished, by method "
        "(held-out sites with the same seeds together): **fedavg** seeds 0-2 at BMC, HK. **ga** seeds 0-2 at BMC; "
        "seeds 0-3 at HK.\n\n- **ga** vs fedavg")

    # a folder made a part at a time, with a failed run: the cells not run yet and the failure are said
    part = [r for r in records if r["run"]["held_out"] == "BMC" and r["run"]["seed"] == 0]
    part.append({**_prostate_record("ga", "BMC", 1, [0.5] * 4), "status": "failed"})
    stats = [comparisons(part, "fedavg", ["BMC", "HK"], n_resamples=200)]
    assert verdicts(markdown(part, stats, ["fedavg", "ga"], ["BMC", "HK"])).startswith(
        "From 2 finished runs, 1 seed per cell in 2 of 4 cells. The folder's 3 recorded runs (2 finished, 1 not) "
        "took 0.1 hours of wall time")


def test_the_basis_of_a_folder_where_nothing_finished_says_so():
    from feddg.benchmark.provenance import machine_time
    from feddg.benchmark.tables import evidence_basis

    assert evidence_basis([], 4, machine_time([]), None) == "No run has finished yet."
    failed = {**_prostate_record("ga", "BMC", 0, [0.5] * 4), "status": "failed", "executor": {"executor": "local"}}
    assert evidence_basis([failed], 4, machine_time([failed]), None) == (
        "No run has finished yet. The folder's 1 recorded run took 0.0 hours of wall time (runs at once counted once; "
        "0.0 run-hours), 60.0 runs per hour (run by local: 1).")


def test_the_seeds_finished_are_said_per_method_with_sites_of_the_same_seeds_grouped():
    from feddg.benchmark.tables import seed_coverage

    sites = ["BMC", "HK", "UCL"]
    per_cell = {("fedavg", "BMC"): {0: 0.7, 1: 0.7, 2: 0.7, 5: 0.7}, ("fedavg", "HK"): {0: 0.7, 1: 0.7, 2: 0.7, 5: 0.7},
                ("fedavg", "UCL"): {5: 0.7}, ("ga", "HK"): {3: 0.6, 4: 0.6}}
    assert seed_coverage(per_cell, ["fedavg", "uniform", "ga"], sites) == (
        "Seeds finished, by method (held-out sites with the same seeds together): **fedavg** seeds 0-2, 5 at BMC, "
        "HK; seed 5 at UCL. **ga** seeds 3-4 at HK; none at BMC, UCL.")  # uniform: nothing finished, not listed
    every = {(m, s): {0: 0.5, 1: 0.5} for m in ["fedavg", "ga"] for s in sites}
    assert seed_coverage(every, ["fedavg", "ga"], sites) == (
        "Finished: seeds 0-1, for every method at every held-out site.")
    assert seed_coverage({}, ["fedavg"], sites) == ""


def test_pooled_seed_sd_is_the_root_of_the_mean_cell_variance():
    from feddg.benchmark.scores import pooled_seed_sd, seed_spread

    records = []
    for site, values in {"BMC": [0.5, 0.6, 0.7], "HK": [0.4, 0.4]}.items():  # variances 0.01 and 0
        for seed, value in enumerate(values):
            records.append(_prostate_record("fedavg", site, seed, [value] * 4))
    records.append(_prostate_record("ga", "BMC", 0, [0.9] * 4))  # one seed: not a spread
    assert pooled_seed_sd(seed_spread(records)) == {"sd": pytest.approx(0.005 ** 0.5), "cells": 2, "runs": 5}
    assert pooled_seed_sd(seed_spread(records[-1:])) is None


def test_machine_time_counts_runs_made_at_once_once():
    from feddg.benchmark.provenance import machine_time

    def run(wall, ended_at=None, parallel=None):
        record = {"wall_s": wall, "executor": {"executor": "local", "parallel": parallel}}
        return record if ended_at is None else {**record, "ended_at": ended_at}

    # two at once from t=0 (100 s and 60 s), a third 50 s after a gap of 40 s: busy 100 + 50 = 150 s
    spent = machine_time([run(100, 100), run(60, 60), run(50, 190)])
    assert spent["wall_hours"] == pytest.approx(150 / 3600) and spent["run_hours"] == pytest.approx(210 / 3600)
    assert spent["runs_per_hour"] == pytest.approx(3 * 3600 / 150)
    # one run inside another adds nothing
    assert machine_time([run(100, 100), run(10, 50)])["wall_hours"] == pytest.approx(100 / 3600)
    # runs recorded before ended_at was kept: their share of the machine (2 at once: half each)
    legacy = machine_time([run(180, parallel=2), run(180, parallel=2), run(60)])
    assert legacy["wall_hours"] == pytest.approx(240 / 3600) and legacy["run_hours"] == pytest.approx(420 / 3600)
    assert legacy["runs_by_executor"] == {"local": 3}


@pytest.mark.parametrize("args, message", [
    (["--seeds", ""], "--seeds is empty"),
    (["--seeds", "0,1,1"], r"--seeds '0,1,1': seed\(s\) \[1\] given twice"),
    (["--seeds", "-2"], "--seeds '-2'.*non-negative"),
    (["--held-out", "Domain9"], r"--held-out \['Domain9'\]: not among the task's sites"),
    (["--methods", "fedavg,fedsr"], r"--methods \['fedsr'\]: unknown method"),
    (["--methods", ""], r"--methods '': an empty name"),
    (["--resamples", "0"], "--resamples 0"),
    (["--set", "train.rounds=1", "--methods", "ga"], "ga would not act under this protocol"),
    (["--methods", "fedavg,fedavg"], "--methods 'fedavg,fedavg': fedavg given twice"),
    (["--methods", "fedavg,"], "--methods 'fedavg,': an empty name"),
    (["--held-out", ""], "--held-out '': an empty name"),
    (["--held-out", "Domain1,Domain1"], "--held-out 'Domain1,Domain1': Domain1 given twice"),
    (["--data-root", ""], "--data-root is empty"),
    (["--layout", "dofe_png"], "--layout dofe_png needs --data-root"),
    (["--out", ""], "--out is empty"),
    (["--out", str(COMMITTED_JOBS)], "is in the repository's committed"),
    (["--out", str(COMMITTED_JOBS / "fundus_fedavg")], "is in the repository's committed"),
    (["--run-timeout", "0"], "argument --run-timeout: '0': give a positive number of seconds"),
    (["--run-timeout", "nan"], "argument --run-timeout: 'nan': give a finite number"),
    (["--run-timeout", "inf"], "argument --run-timeout: 'inf': give a finite number"),
    (["--resamples", "0"], "--resamples 0: give a positive number of resamples"),
    (["--set", "train.seed=5"], "--set train.seed: the sweep sets it for each run from --seeds"),
    (["--set", "data.unseen_site=Domain2"], "--set data.unseen_site: the sweep sets it for each run from --held-out"),
    (["--", "--bogus"], "--bogus: not a flag of nvflare simulator"),
    (["--", "-t", "x"], "simulator flags -t x: argument -t/--threads: invalid int value: 'x'"),
    (["--", "-w", "/tmp/elsewhere"], "the workspace is feddg's to give"),
])
def test_bad_sweep_options_are_refused_in_one_line_before_anything_runs(tmp_path, capsys, args, message):
    """Each a mistake a new user makes; none may change what runs or start a run."""
    from feddg.cli import main

    out = tmp_path / "out"
    try:
        code = main(["benchmark", "--task", "fundus", "--out", str(out), *args])
    except SystemExit as ended:  # argparse's own refusal of a value (the option types): usage, then one line
        code = ended.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and __import__("re").search(message, err.splitlines()[-1]), err
    assert not out.exists()


def test_a_dry_run_prints_the_plan_of_the_default_protocol_and_writes_nothing(tmp_path, capsys):
    from feddg.benchmark.sweep import PILOT_SECONDS_PER_ROUND, SWEEP_ROUNDS
    from feddg.cli import main

    out = tmp_path / "out"
    assert main(["benchmark", "--task", "fundus", "--methods", "fedavg,uniform", "--out", str(out), "--dry-run"]) == 0
    hours = 2 * 4 * 5 * SWEEP_ROUNDS["fundus"] * PILOT_SECONDS_PER_ROUND["fundus"] / 3600
    assert f"40 runs, 0 done before, 40 to run: about {hours:.1f} run-hours" in capsys.readouterr().out
    assert not out.exists()


def test_tables_only_rewrites_a_folders_tables_with_this_code_and_runs_nothing(tmp_path, monkeypatch, capsys):
    """After runs made by another code version's sweep (which writes its own table format), ``--tables-only``
    writes what this code's ``write_results`` writes from the same runs, and never reaches the sweep; a folder
    without runs, another task's, or an option that would run something or choose cells is refused in one line,
    changing nothing."""
    import shutil

    from feddg.benchmark import sweep as sweep_module
    from feddg.benchmark.results import write_results
    from feddg.cli import main
    from feddg.experiment import TASK_DEFAULTS
    from feddg.flare.registry import methods

    committed = REPOSITORY / "benchmarks" / "results" / "ga_step_fundus"  # 5 GA runs
    ours, reference = tmp_path / "ours", tmp_path / "reference"
    for folder in (ours, reference):
        folder.mkdir()
        shutil.copytree(committed / "runs", folder / "runs")
        for name in ("sweep.json", ".feddg-folder"):
            shutil.copy(committed / name, folder / name)
        (folder / "results.md").write_text("tables of another code\n")
    monkeypatch.setattr(sweep_module, "sweep", lambda *a, **kw: pytest.fail("--tables-only ran the sweep"))
    assert main(["benchmark", "--task", "fundus", "--out", str(ours), "--tables-only", "--resamples", "200"]) == 0
    write_results(reference, list(methods()), TASK_DEFAULTS["fundus"]["data"]["sites"], 200)
    written = (ours / "results.md").read_text()
    assert written == (reference / "results.md").read_text() and "numbers family" in written
    capsys.readouterr()

    for args, message in [
        (["--task", "prostate", "--out", str(ours)], f"--tables-only: {ours} holds fundus runs, not --task prostate"),
        (["--task", "fundus", "--out", str(ours), "--dry-run", "--retry-failed"],
         "--tables-only runs nothing and writes the tables of every run of the folder: leave out --dry-run, "
         "--retry-failed"),
        (["--task", "fundus", "--out", str(ours), "--reproduce-check"], "leave out --reproduce-check"),
        (["--task", "fundus", "--out", str(ours), "--methods", "ga"], "leave out --methods"),
        (["--task", "fundus", "--out", str(ours / "runs" / "none")], "has no sweep.json"),
    ]:
        assert main(["benchmark", *args, "--tables-only"]) == 2
        assert message in capsys.readouterr().err
    assert (ours / "results.md").read_text() == written and not (ours / "runs" / "none").exists()


def test_an_unknown_sweep_option_is_refused_by_name_and_never_reaches_the_simulator(tmp_path, capsys):
    from feddg.cli import main

    with pytest.raises(SystemExit) as ended:  # argparse's own error: usage, then the line naming the option
        main(["benchmark", "--task", "fundus", "--heldout", "Domain1", "--out", str(tmp_path / "out")])
    assert ended.value.code == 2
    assert "unrecognized arguments: --heldout Domain1 (flags for nvflare simulator go after --)" in \
        capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_current_folder_is_refused_as_out(tmp_path, monkeypatch, capsys):
    from feddg.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["benchmark", "--task", "fundus", "--out", ".", "--dry-run"]) == 2
    assert f"--out '.' ({tmp_path.resolve()}) is the current folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_relative_data_root_is_made_absolute_before_any_run(tmp_path, monkeypatch):
    from feddg.benchmark import sweep as sweep_module
    from feddg.cli import main

    protocols: list = []
    monkeypatch.setattr(sweep_module, "sweep", lambda out, protocol, *a, **kw: protocols.append(protocol) or [])
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    for given in (["--data-root", "data"], ["--set", "data.root=data"]):
        assert main(["benchmark", "--task", "fundus", "--set", "train.rounds=2", *given, "--out", "out",
                     "--dry-run"]) == 0
    assert [p.overrides["data"]["root"] for p in protocols] == [str(tmp_path.resolve() / "data")] * 2


def test_pairs_made_on_different_cpu_families_are_marked_in_the_tables(tmp_path):
    """A run's CPU comes from its record, or for a run from before runs kept it from the folder's cpu_timeline.json;
    a pair split across CPU families (maker and kernels) is marked (†) with a footnote naming method, site, seeds
    and both families."""
    import json

    from feddg.benchmark.record import run_records
    from feddg.benchmark.tables import comparisons, markdown

    records = _design({"ga": 0.05})
    for r in records:  # seeds 0-1 ended before the switch, seed 2 of ga after it
        r["ended_at"] = 100.0 if (r["run"]["method"] == "ga" and r["run"]["seed"] == 2) else 10.0
    for r in records:
        folder = tmp_path / "runs" / r["run_id"]
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(r))
    (tmp_path / "cpu_timeline.json").write_text(json.dumps({"source": "a test", "windows": [
        {"cpu": "AMD EPYC", "avx512": False, "until": 50}, {"cpu": "Intel Xeon", "avx512": True, "from": 50}]}))
    loaded = list(run_records(tmp_path).values())
    assert {r["executor"]["cpu"] for r in loaded if r["run"]["seed"] == 2 and r["run"]["method"] == "ga"} == \
        {"Intel Xeon"}
    stats = comparisons(loaded, "fedavg", ["BMC", "HK"], n_resamples=200)
    assert stats["methods"]["ga"]["cross_cpu"] == {
        s: [{"seed": 2, "ga": "Intel native-avx512", "fedavg": "AMD avx2"}] for s in ("BMC", "HK")}
    assert stats["methods"]["uniform"]["cross_cpu"] == {}
    text = markdown(loaded, [stats], ["fedavg", "uniform", "ga"], ["BMC", "HK"])
    row = next(line for line in text.splitlines() if line.startswith("| ga | +0.0"))
    assert row.count(" †") == 2
    assert "† pairs whose two runs were made on different CPU families (maker and kernels), which alone move a run: " \
           "ga at BMC, seed 2 (Intel native-avx512 against AMD avx2); ga at HK, seed 2 (Intel native-avx512 against " \
           "AMD avx2)." in text


@pytest.mark.parametrize("timeline, message", [
    ({"windows": [{"cpu": "AMD EPYC"}]}, "'source' must say how"),
    ({"source": "x", "windows": []}, "'windows' must be a non-empty list"),
    ({"source": "x", "windows": [{"cpu": ""}]}, r"windows\[0\].cpu must name a CPU model"),
    ({"source": "x", "windows": [{"cpu": "A", "until": "yesterday"}]}, r"windows\[0\].until is 'yesterday'"),
    ({"source": "x", "windows": [{"cpu": "A", "signature": ""}]}, r"windows\[0\].signature must be a CPU signature"),
])
def test_a_malformed_cpu_timeline_is_refused_naming_the_field(tmp_path, timeline, message):
    import json

    from feddg.benchmark.record import run_records

    (tmp_path / "cpu_timeline.json").write_text(json.dumps(timeline))
    with pytest.raises(ConfigError, match=message):
        run_records(tmp_path)


def test_cells_made_by_several_code_versions_are_named():
    from feddg.benchmark.provenance import mixed_code_cells

    records = _design({"ga": 0.05})
    for r in records:
        r["code"] = "b" * 64 if (r["run"]["method"] == "ga" and r["run"]["held_out"] == "HK" and
                                 r["run"]["seed"] > 0) else "a" * 64
    assert mixed_code_cells(records) == ("Cells whose seeds were made by more than one code version: ga at HK "
                                         "(aaaaaaaaaaaa: seed 0; bbbbbbbbbbbb: seeds 1-2).")
    assert mixed_code_cells(_design({"ga": 0.05})) == ""


def test_seed_lists_and_sites_grouped_by_their_seeds():
    from feddg.benchmark.provenance import sites_by_seeds
    from feddg.benchmark.stats import seed_list

    assert seed_list([0, 3, 4, 5]) == "seeds 0, 3-5"
    assert seed_list([5]) == "seed 5"
    assert seed_list([1, 3]) == "seeds 1, 3"
    assert sites_by_seeds({"BMC": [0, 1], "HK": [], "I2CVB": [5], "UCL": [0, 1]}) == (
        "seeds 0-1 at BMC, UCL; seed 5 at I2CVB")


def test_the_runs_still_to_run_are_listed_by_the_cpu_family_that_holds_their_seed():
    from feddg.benchmark.provenance import still_to_run

    def run(method, site, seed, cpu, avx512):
        return {**_prostate_record(method, site, seed, [0.5] * 4), "executor": {"cpu": cpu, "avx512": avx512}}

    design = {"fedavg": {"BMC": [0, 1, 2], "HK": [0, 1, 2]}, "ga": {"BMC": [0, 1, 2], "HK": [0, 1, 2]}}
    records = [run("fedavg", "BMC", 0, "AMD EPYC", False), run("fedavg", "HK", 0, "AMD EPYC", False),
               run("ga", "HK", 0, "AMD EPYC", False), run("fedavg", "BMC", 1, "Intel(R) Xeon(R)", True),
               run("fedavg", "HK", 1, "Intel(R) Xeon(R)", True), run("ga", "BMC", 1, "Intel(R) Xeon(R)", True),
               run("ga", "HK", 1, "Intel(R) Xeon(R)", True),
               {**run("ga", "BMC", 0, "AMD EPYC", False), "status": "failed"}]  # failed: still to run
    # seed 0: AMD avx2 (3 finished), missing ga BMC; seed 1: Intel, complete; seed 2: no run yet, all four missing
    assert still_to_run(design, records, ["fedavg", "ga"], ["BMC", "HK"]) == (
        "Still to run, 5 runs, each on a machine of the CPU family that holds its seed (a pair's two runs must come "
        "from one): **AMD avx2** (seed 0, 1 run): ga (seed 0 at BMC). **any family (seeds no run has made yet)** "
        "(seed 2, 4 runs): fedavg (seed 2 at BMC, HK), ga (seed 2 at BMC, HK).")
    done = [run(m, s, k, "AMD EPYC", False) for m in design for s in design[m] for k in design[m][s]]
    assert still_to_run(design, done, ["fedavg", "ga"], ["BMC", "HK"]) == ""
    assert still_to_run({}, records, ["fedavg", "ga"], ["BMC", "HK"]) == ""


def test_the_how_to_read_note_says_how_the_synthetic_sites_differ_under_the_protocol():
    from feddg.benchmark.results import _how_to_read

    default = _how_to_read({"overrides": {"data": {"synthetic": {"held_out_cases": 24}}}})
    style_only = _how_to_read({"overrides": {"data": {"synthetic": {"shift": "style_only"}}}})
    real = _how_to_read({"overrides": {"data": {"root": "/data/prostate"}}})
    assert "sites that differ in style, content and labelling by construction" in default
    assert "sites that differ in style alone (data.synthetic.shift: style_only) by construction" in style_only
    assert "synthetic" not in real and "the protocol's data.root" in real
