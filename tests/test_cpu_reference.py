"""A run repeats bit for bit on its CPU family (:mod:`feddg.numerics`, ``benchmarks/cpu_reference.py``): the
committed reference of the suite machine's family re-run there, and the reference files checked as input."""

from __future__ import annotations

import json

import pytest

from benchmarks.cpu_reference import JOBS, REFERENCES, compare, family_here, measure, read_reference
from feddg.benchmark.record import run_family, run_records
from feddg.numerics import (CPU_PIN_ENV, SAME_NUMBERS, cpu_pin_mode, effective_kernels, numbers_family,
                            pinned_environment)
from tests.conftest import REPOSITORY


@pytest.mark.slow
def test_a_run_repeats_the_committed_reference_of_this_machines_family(tmp_path, monkeypatch):
    """The reference of this machine's CPU family (maker, kernels, generation and caches), re-run here: the final
    weights and every per-case score identical. A family with no committed reference yet is skipped, naming it
    (write one with ``benchmarks/cpu_reference.py --write``); another family's reference is not expected to repeat
    here (an Intel Xeon pinned to AVX2 re-ran AMD EPYC runs with other numbers, and so did one AMD EPYC without
    AVX-512 another's: docs/benchmark.md, "CPU numerics"), nor one written before
    references recorded the CPU's signature, whose generation is not known."""
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))
    references = {p.name: read_reference(p) for p in sorted(REFERENCES.glob("*.json"))}
    ours = {name: r for name, r in references.items() if r["family"] == family_here()}
    if not ours:
        pytest.skip(f"no committed reference of this machine's family ({family_here()}); committed: "
                    f"{sorted(r['family'] for r in references.values())}")
    measured = measure(tmp_path)
    for name, reference in ours.items():
        difference = compare(reference, measured)
        assert difference is None, f"{name} (made on {reference['cpu']}) re-run on {measured['cpu']}: {difference}"


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(cpu_pin="avx512"), "'cpu_pin' is 'avx512', not one of avx2, off"),
    (lambda d: d.update(family="Intel avx2"), "'family' is 'Intel avx2', but its cpu, cpu_kind, cpu_pin and "
                                              "signature make"),
    (lambda d: d.update(signature="23/49 L3 16M"), "but its cpu, cpu_kind, cpu_pin and signature make 'AMD avx2 "
                                                  "\\[23/49 L3 16M\\]'"),
    (lambda d: d.update(signature=""), "'signature' is '', not a CPU signature"),
    (lambda d: d.pop("cpu"), "no 'cpu' \\(str\\)"),
    (lambda d: d["jobs"].update(fundus_ga=d["jobs"]["fundus_fedavg"]), "jobs.fundus_ga is not one of this script's"),
    (lambda d: d["jobs"]["fundus_fedavg"]["overrides"].append("train.rounds=2"), "jobs.fundus_fedavg is not one"),
    (lambda d: d["jobs"]["prostate_fedavg"].update(scores={}), "jobs.prostate_fedavg.scores holds no per-case"),
    (lambda d: d["jobs"]["fundus_fedavg"].update(weights="abc"), "jobs.fundus_fedavg.weights is not a SHA-256"),
    (lambda d: d["jobs"]["fundus_fedavg"].update(weights=7), "jobs.fundus_fedavg.weights is not a SHA-256"),
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
        if reference["jobs"]["fundus_fedavg"].get("weights"):
            other = json.loads(json.dumps(reference))
            other["jobs"]["fundus_fedavg"]["weights"] = "0" * 64
            assert compare(reference, other).startswith("fundus_fedavg: the final global model's weights differ")


def test_the_pin_is_one_setting_with_its_variables():
    assert cpu_pin_mode({}) == "off" and cpu_pin_mode({CPU_PIN_ENV: "avx2"}) == "avx2"
    with pytest.raises(ValueError, match=f"{CPU_PIN_ENV}='avx512'"):
        cpu_pin_mode({CPU_PIN_ENV: "avx512"})
    assert pinned_environment("avx2") == {CPU_PIN_ENV: "avx2", "ATEN_CPU_CAPABILITY": "avx2",
                                          "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
    assert pinned_environment("off") == {CPU_PIN_ENV: "off"}
    assert effective_kernels("avx2", False) == effective_kernels("off", False) == "avx2"
    assert effective_kernels("off", True) == "native-avx512" and effective_kernels("off", None) == "unknown"
    assert effective_kernels("avx2", True) == "avx2-pinned" and effective_kernels("avx2", None) == "unknown"
    # what a run repeats on: the maker is part of it (pinned Intel runs did not repeat AMD ones), and so is the CPU's
    # having AVX-512 (an AMD EPYC with it, pinned, did not repeat one without it)
    assert numbers_family("AMD EPYC 7B13", "off", False) == numbers_family("AMD EPYC", "avx2", False) == "AMD avx2"
    assert numbers_family("AMD EPYC", "avx2", True) == "AMD avx2-pinned"
    assert numbers_family("AMD EPYC", "off", True) == "AMD native-avx512"
    assert numbers_family("Intel(R) Xeon(R) Processor", "avx2", True) == "Intel avx2-pinned"
    assert numbers_family("Intel Xeon", "off", True) == "Intel native-avx512"
    assert numbers_family(None, "off", False) == numbers_family("Intel Xeon", "off", None) == "unknown"
    assert numbers_family("AMD EPYC", "off", False, "23/49 L3 16M") == "AMD avx2 [23/49 L3 16M]"
    assert numbers_family(None, "off", False, "23/49 L3 16M") == "unknown"
    # a generation measured to repeat another's runs takes that family's name; another keeps its own
    assert numbers_family("AMD EPYC", "off", False, "25/1 L1d 32K L2 512K L3 32M") == \
        "AMD avx2 [23/49 L1d 32K L2 512K L3 16M]"
    assert numbers_family("AMD EPYC", "off", False, "25/1 L1d 32K L2 512K L3 16M") == \
        "AMD avx2 [25/1 L1d 32K L2 512K L3 16M]"


def test_each_signature_that_joins_a_family_rests_on_whole_runs_that_repeated_it():
    """SAME_NUMBERS is a measurement: for each entry the committed comparisons of whole runs show no per-case score
    and no round's training loss differing, and a family's name is not itself mapped on (one step, no chains)."""
    checks = REPOSITORY / "benchmarks/results/cpu_check_prostate"
    evidence = {"25/1 L1d 32K L2 512K L3 32M": sorted(checks.glob("amd_avx2_25-1_code_7178543b_*_RUNMC_seed6"))}
    assert set(evidence) == set(SAME_NUMBERS), "each entry names its evidence here"
    the_set = REPOSITORY / "benchmarks/results/loso_prostate_seeds"
    made_then = run_records(the_set)  # the set's runs, with the CPU its timeline gives those that predate fields
    for signature, folders in evidence.items():
        assert SAME_NUMBERS[signature] not in SAME_NUMBERS
        assert len(folders) == 2, folders
        for folder in folders:
            same = json.loads((folder / "same_cell.json").read_text())
            reference, again = (REPOSITORY / run for run in same["runs"])
            assert reference.parent.parent == the_set / "runs" and again.parent == folder, same["runs"]
            family = run_family(made_then[reference.parent.name])
            assert family == f"AMD avx2 [{SAME_NUMBERS[signature]}]", "the reference is of the family joined"
            assert [(r["case_scores"], r["differing_case_scores"], r["first_loss_difference"]) for r in
                    same["rows"]] == [(204, 0, None)] * 2, folder


def test_the_cpu_signature_is_the_generation_and_the_data_caches_of_the_first_core(tmp_path):
    from benchmarks.cpu_reference import reference_path
    from feddg.numerics import cpu_signature

    cpuinfo = tmp_path / "cpuinfo"
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: {f}\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\n"
    cpuinfo.write_text(block.format(n=0, f=23, m=49) + "\n" + block.format(n=1, f=99, m=99))
    caches = tmp_path / "cache"
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"),
                                             (3, "Unified", "16384K")]):
        (caches / f"index{i}").mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (caches / f"index{i}" / name).write_text(f"{value}\n")
    assert cpu_signature(cpuinfo, caches) == "23/49 L1d 32K L2 512K L3 16M"
    assert cpu_signature(cpuinfo, tmp_path / "none") == "23/49"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert cpu_signature(cpuinfo, caches) is None
    assert cpu_signature(tmp_path / "missing", caches) is None
    assert reference_path("AMD avx2 [23/49 L1d 32K L2 512K L3 16M]").name == \
        "AMD-avx2-23-49-L1d-32K-L2-512K-L3-16M.json"
    assert reference_path("Intel native-avx512").name == "Intel-native-avx512.json"


def test_the_cost_table_times_both_pins_side_by_side_and_compares_their_scores(tmp_path, monkeypatch):
    """--cost on a stand-in for the runs (the real ones take minutes): alternating pins, medians, the ratio, and the
    per-case comparison of the two."""
    import benchmarks.cpu_reference as script

    calls = []

    def fake_run(job, overrides, workdir, pin="avx2"):
        calls.append((job, pin))
        return {"weights": pin if job == "fundus_fedavg" else "same",
                "scores": {"final": {"A": {"test": {"0": {"disc": {"dice": 0.5 if pin == "off" or job == "fundus_fedavg"
                                                                   else 0.6}}}}}}}

    monkeypatch.setattr(script, "run_job", fake_run)
    table = script.cost(tmp_path, 2)
    assert calls[:4] == [("fundus_fedavg", "off"), ("fundus_fedavg", "avx2")] * 2
    lines = table.splitlines()
    assert lines[0].startswith("| job | unpinned (s) | pinned avx2 (s) | pinned / unpinned | final weights |")
    assert lines[2].startswith("| fundus_fedavg |") and lines[2].endswith("| differ | identical |")
    assert "| identical | differ: final.A.test.0.disc.dice: 0.5 unpinned, 0.6 pinned" in lines[3]


def test_write_refuses_to_replace_the_reference_of_a_family_made_on_another_signature(tmp_path, monkeypatch, capsys):
    """A 25/1 machine is of the 23/49 family by measurement (SAME_NUMBERS): ``--write`` there would replace the
    family's reference, made on 23/49, with its own; refused, the file unchanged. A machine of the reference's own
    signature still writes it."""
    import benchmarks.cpu_reference as script

    family = "AMD avx2 [23/49 L1d 32K L2 512K L3 16M]"
    monkeypatch.setattr(script, "REFERENCES", tmp_path)
    committed = script.reference_path(family)
    committed.write_text(json.dumps({"signature": "23/49 L1d 32K L2 512K L3 16M", "family": family}))
    before = committed.read_bytes()
    measured = {"cpu": "AMD EPYC", "family": family, "code": "c0de", "signature": "25/1 L1d 32K L2 512K L3 32M"}
    monkeypatch.setattr(script, "measure", lambda workdir: dict(measured))
    assert script.main(["--write"]) == 2
    assert "made on 23/49 L1d 32K L2 512K L3 16M" in capsys.readouterr().err and committed.read_bytes() == before
    monkeypatch.setattr(script, "measure", lambda workdir: {**measured, "signature": "23/49 L1d 32K L2 512K L3 16M"})
    assert script.main(["--write"]) == 0 and json.loads(committed.read_text())["code"] == "c0de"
