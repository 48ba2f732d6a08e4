"""Pinned runs repeat bit for bit (:mod:`feddg.numerics`, ``benchmarks/cpu_reference.py``): the committed
references re-run on whatever machine the suite runs on, and the reference files checked as input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cpu_reference import JOBS, REFERENCES, compare, cpu_kind, measure, read_reference
from feddg.numerics import CPU_PIN_ENV, cpu_pin_mode, effective_kernels, pinned_environment


@pytest.mark.slow
def test_a_pinned_run_repeats_every_committed_reference(tmp_path, monkeypatch):
    """On a machine of a reference's CPU kind every per-case score must be identical. On the other kind this is the
    cross-CPU proof the pin is for: identical passes; a difference is reported as a skip with the first differing
    score, because no machine of that kind was available to prove the pin when it was written (issue 41 keeps
    that part open: docs/benchmark.md, "CPU numerics")."""
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))
    references = {p.name: read_reference(p) for p in sorted(REFERENCES.glob("*.json"))}
    assert references, f"no reference under {REFERENCES}"
    measured = measure(tmp_path)
    unproven = []
    for name, reference in references.items():
        difference = compare(reference, measured)
        if reference["cpu_kind"] == cpu_kind():
            assert difference is None, f"{name} (made on {reference['cpu']}) re-run here: {difference}"
        elif difference is not None:
            unproven.append(f"{name} (made on {reference['cpu']}) re-run on {measured['cpu']}: {difference}")
    if unproven:
        pytest.skip("the AVX2 pin does not repeat across CPU kinds: " + "; ".join(unproven))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(cpu_pin="off"), "'cpu_pin' is 'off', not 'avx2'"),
    (lambda d: d.pop("cpu"), "no 'cpu' \\(str\\)"),
    (lambda d: d["jobs"].update(fundus_ga=d["jobs"]["fundus_fedavg"]), "jobs.fundus_ga is not one of this script's"),
    (lambda d: d["jobs"]["fundus_fedavg"]["overrides"].append("train.rounds=2"), "jobs.fundus_fedavg is not one"),
    (lambda d: d["jobs"]["prostate_fedavg"].update(scores={}), "jobs.prostate_fedavg.scores holds no per-case"),
])
def test_an_edited_or_foreign_reference_is_refused_naming_the_field(tmp_path, change, message):
    (committed,) = [p for p in sorted(REFERENCES.glob("*.json"))][:1]
    data = json.loads(committed.read_text())
    change(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as e:
        read_reference(path)
    assert str(path) in str(e.value)


def test_the_committed_references_are_this_scripts_and_their_differences_are_named():
    for path in sorted(REFERENCES.glob("*.json")):
        reference = read_reference(path)
        assert set(reference["jobs"]) == set(JOBS) and compare(reference, reference) is None
        moved = json.loads(json.dumps(reference))
        scores = moved["jobs"]["prostate_fedavg"]["scores"]
        site = next(iter(scores["final"]))
        split = next(iter(scores["final"][site]))
        case = next(iter(scores["final"][site][split]))
        entry = scores["final"][site][split][case]
        structure = next(iter(entry))
        entry[structure]["dice"] += 1e-12
        assert compare(reference, moved).startswith(f"prostate_fedavg: final.{site}.{split}.{case}.{structure}.dice")


def test_the_pin_is_one_setting_with_its_variables():
    assert cpu_pin_mode({}) == "off" and cpu_pin_mode({CPU_PIN_ENV: "avx2"}) == "avx2"
    with pytest.raises(ValueError, match=f"{CPU_PIN_ENV}='avx512'"):
        cpu_pin_mode({CPU_PIN_ENV: "avx512"})
    assert pinned_environment("avx2") == {CPU_PIN_ENV: "avx2", "ATEN_CPU_CAPABILITY": "avx2",
                                          "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
    assert pinned_environment("off") == {CPU_PIN_ENV: "off"}
    assert effective_kernels("avx2", True) == effective_kernels("off", False) == "avx2"
    assert effective_kernels("off", True) == "native-avx512" and effective_kernels("off", None) == "unknown"


def test_a_folder_is_refused_for_runs_made_with_other_kernels(tmp_path):
    """A sweep pinned to AVX2 refuses a folder holding an unpinned run made on an AVX-512 CPU (the pair would mix
    kernel families), naming the run and the field; --move-aside-mismatched moves it."""
    from feddg.benchmark.protocol import Protocol, Run, run_experiment
    from feddg.benchmark.record import check_records
    from feddg.config import ConfigError

    protocol = Protocol("fundus", {"train": {"rounds": 2, "local_epochs": 1}})
    for seed, avx512 in ((0, False), (1, True)):
        run = Run("fundus", "fedavg", "Domain1", seed)
        folder = tmp_path / "runs" / run.run_id
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({
            "run": run.__dict__, "run_id": run.run_id, "status": "ok", "wall_s": 1.0, "cpu_pin": "off",
            "config": run_experiment(protocol, run), "simulator_args": [],
            "executor": {"cpu": "Intel Xeon" if avx512 else "AMD EPYC", "avx512": avx512}}))
    with pytest.raises(ConfigError, match=r"fundus_fedavg_Domain1_seed1: cpu_pin 'off' on Intel Xeon gives "
                                          r"native-avx512 kernels in the run, avx2 in this sweep"):
        check_records(tmp_path, protocol, kernels="avx2")
    check_records(tmp_path, protocol, kernels="avx2", move_aside=True, report=lambda _: None)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["fundus_fedavg_Domain1_seed0"]
    assert Path(tmp_path / "aside" / "fundus_fedavg_Domain1_seed1" / "run.json").exists()


def test_the_cost_table_times_both_pins_side_by_side_and_compares_their_scores(tmp_path, monkeypatch):
    """--cost on a stand-in for the runs (the real ones take minutes): alternating pins, medians, the ratio, and the
    per-case comparison of the two."""
    import benchmarks.cpu_reference as script

    calls = []

    def fake_run(job, overrides, workdir, pin="avx2"):
        calls.append((job, pin))
        return {"final": {"A": {"test": {"0": {"disc": {"dice": 0.5 if pin == "off" or job == "fundus_fedavg"
                                                        else 0.6}}}}}}

    monkeypatch.setattr(script, "run_job", fake_run)
    table = script.cost(tmp_path, 2)
    assert calls[:4] == [("fundus_fedavg", "off"), ("fundus_fedavg", "avx2")] * 2
    lines = table.splitlines()
    assert lines[0].startswith("| job | unpinned (s) | pinned avx2 (s) | pinned / unpinned |")
    assert lines[2].startswith("| fundus_fedavg |") and lines[2].endswith("| identical |")
    assert "differ: final.A.test.0.disc.dice: 0.5 unpinned, 0.6 pinned" in lines[3]
