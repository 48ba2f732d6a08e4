"""benchmarks/cpu_window.py: a CPU signature window is written only on a probe that repeated a run of the family it
makes, on a machine like the probe's, and never misplaces a run (copies of committed prostate run records)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

import benchmarks.cpu_window as cpu_window
from feddg.benchmark.provenance import families_of_runs, runs_by_family
from feddg.benchmark.record import CPU_TIMELINE, run_family, run_records
from feddg.config import ConfigError
from tests.conftest import REPOSITORY

SET = REPOSITORY / "benchmarks/results/loso_prostate_seeds"
SIGNATURE = "23/49 L1d 32K L2 512K L3 16M"
HERE = {"cpu": "AMD EPYC", "avx512": False, "cpu_signature": SIGNATURE}
NEW = "23/113 L1d 32K L2 512K L3 32M"  # a generation no run of the set was made on
START, UNTIL = 1900000000, 1900010000  # a session (2030) after every run the set will hold


def _record(name: str) -> dict:
    return json.loads((SET / "runs" / name / "run.json").read_text())


def _put(out: Path, name: str, record: dict) -> Path:
    path = out / "runs" / name / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """A results folder with the set's timeline and a seed-6 run (signed family) and a seed-0 run (unsigned)."""
    out = tmp_path / "set"
    for name in ("prostate_fedavg_BIDMC_seed6", "prostate_fedavg_BIDMC_seed0"):
        _put(out, name, _record(name))
    shutil.copy(SET / CPU_TIMELINE, out / CPU_TIMELINE)
    return out


def _probe(tmp_path: Path, reference: Path, difference: str | None = None, executor: dict | None = None) -> dict:
    """same_cell.py's output comparing ``reference`` with a run made here (the admitted code: no signature)."""
    record = json.loads(reference.read_text())
    record["executor"] = {**record.get("executor", {}), "cpu": "AMD EPYC", "avx512": False, **(executor or {})}
    record["ended_at"], record["wall_s"] = START + 200, 100.0  # made at the session's start
    probe_run = _put(tmp_path / "probe", record["run_id"], record)
    row = {"run_id": record["run_id"], "code": record["code"], "first_loss_difference": None, "rounds_compared": 3}
    return {"runs": [str(reference), str(probe_run)],
            "rows": [{**row, "label": "set"}, {**row, "label": "here", "first_loss_difference": difference}]}


def test_a_repeating_probe_gives_this_machines_signature_to_the_sessions_runs_only(folder, tmp_path):
    probe = _probe(tmp_path, folder / "runs/prostate_fedavg_BIDMC_seed6/run.json")
    window = cpu_window.probe_window(folder, probe, START, UNTIL, HERE)
    assert {k: window[k] for k in ("cpu", "avx512", "signature", "from", "until")} == {
        "cpu": "AMD EPYC", "avx512": False, "signature": SIGNATURE, "from": START, "until": UNTIL}
    assert window["probe"]["reference"] == "prostate_fedavg_BIDMC_seed6" and window["probe"]["rounds"] == 3
    inside = {**copy.deepcopy(_record("prostate_uniform_BMC_seed6")), "ended_at": START + 500}
    inside["executor"].pop("cpu_signature", None)
    _put(folder, "prostate_uniform_HK_seed6", {**inside, "run_id": "prostate_uniform_HK_seed6"})
    before = run_records(folder)
    assert run_family(before["prostate_uniform_HK_seed6"]) == "AMD avx2", "no window holds it yet"
    timeline = json.loads((folder / CPU_TIMELINE).read_text())["windows"]
    assert cpu_window.add_window(folder, window) == ["runs/prostate_uniform_HK_seed6"]
    assert json.loads((folder / CPU_TIMELINE).read_text())["windows"] == [window, *timeline]
    after = run_records(folder)
    assert run_family(after["prostate_uniform_HK_seed6"]) == f"AMD avx2 [{SIGNATURE}]"
    assert {n: run_family(r) for n, r in after.items() if n != "prostate_uniform_HK_seed6"} == \
        {n: run_family(r) for n, r in before.items() if n != "prostate_uniform_HK_seed6"}, "older runs keep theirs"


def test_a_probe_that_differs_or_is_not_of_this_folder_or_machine_is_refused(folder, tmp_path):
    reference = folder / "runs/prostate_fedavg_BIDMC_seed6/run.json"
    with pytest.raises(ConfigError, match="differ from its reference"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference, difference="round 0: BMC ..."), START, UNTIL, HERE)
    elsewhere = _put(tmp_path / "other", "prostate_fedavg_BIDMC_seed6", _record("prostate_fedavg_BIDMC_seed6"))
    with pytest.raises(ConfigError, match="is not a run of"):
        cpu_window.probe_window(folder, _probe(tmp_path, elsewhere), START, UNTIL, HERE)
    with pytest.raises(ConfigError, match="not on this machine"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference, executor={"cpu": "Intel Xeon", "avx512": True}),
                                START, UNTIL, HERE)
    with pytest.raises(ConfigError, match="this machine's is 'AMD avx2 \\[23/49 L1d 32K L2 1M L3 16M\\]'"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference), START, UNTIL,
                                {**HERE, "cpu_signature": "23/49 L1d 32K L2 1M L3 16M"})
    with pytest.raises(ConfigError, match="signature cannot be read"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference), START, UNTIL, {**HERE, "cpu_signature": None})
    with pytest.raises(ConfigError, match="not before"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference), UNTIL, START, HERE)
    with pytest.raises(ConfigError, match="signature 23/49 L1d 48K"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference, executor={"cpu_signature": "23/49 L1d 48K"}),
                                START, UNTIL, HERE)
    with pytest.raises(ConfigError, match="did not end in the window"):
        cpu_window.probe_window(folder, _probe(tmp_path, reference), START + 1000, UNTIL, HERE)
    itself = {"runs": [str(reference), str(reference)], "rows": _probe(tmp_path, reference)["rows"]}
    with pytest.raises(ConfigError, match="is in .*a probe is a run made here"):
        cpu_window.probe_window(folder, itself, START, UNTIL, HERE)
    nothing = _probe(tmp_path, reference)
    nothing["rows"][1].pop("rounds_compared")
    with pytest.raises(ConfigError, match="compared no training round"):
        cpu_window.probe_window(folder, nothing, START, UNTIL, HERE)
    whole = _probe(tmp_path, reference)  # a whole run compared: every case score, none differing
    whole["rows"][1] = {**whole["rows"][1], "rounds_compared": None, "case_scores": 204, "differing_case_scores": 0}
    assert cpu_window.probe_window(folder, whole, START, UNTIL, HERE)["probe"]["case_scores"] == 204
    whole["rows"][1]["differing_case_scores"] = 3
    with pytest.raises(ConfigError, match="differ from its reference"):
        cpu_window.probe_window(folder, whole, START, UNTIL, HERE)


def test_a_probe_of_a_family_without_a_signature_needs_no_window(folder, tmp_path):
    probe = _probe(tmp_path, folder / "runs/prostate_fedavg_BIDMC_seed0/run.json")
    assert cpu_window.probe_window(folder, probe, START, UNTIL, HERE) is None


def _session_run(folder: Path, name: str, seed: int, ended: float) -> Path:
    """A run of ``folder`` made this session on this machine with the admitted code (no signature recorded)."""
    record = copy.deepcopy(_record("prostate_fedavg_BIDMC_seed6"))
    record["executor"].pop("cpu_signature", None)
    method, held_out = name.split("_")[1:3]
    record.update(run_id=name, ended_at=ended, run={**record["run"], "method": method, "held_out": held_out,
                                                    "seed": seed})
    record["config"]["train"]["seed"] = seed
    return _put(folder, name, record)


def test_a_machine_of_a_new_family_founds_it_with_a_seed_of_its_own(folder, tmp_path):
    reference = _session_run(folder, "prostate_fedavg_BIDMC_seed7", 7, START + 900)  # ended after the probe
    sibling = _session_run(folder, "prostate_uniform_BIDMC_seed7", 7, START + 950)
    assert run_family(run_records(folder)["prostate_fedavg_BIDMC_seed7"]) == "AMD avx2", "unsigned before"
    here = {**HERE, "cpu_signature": NEW}
    window = cpu_window.probe_window(folder, _probe(tmp_path, reference), START, UNTIL, here)
    assert window["probe"]["founds"] is True and window["signature"] == here["cpu_signature"]
    assert cpu_window.add_window(folder, window) == [f"runs/{reference.parent.name}", f"runs/{sibling.parent.name}"]
    families = {n: run_family(r) for n, r in run_records(folder).items()}
    assert families["prostate_fedavg_BIDMC_seed7"] == families["prostate_uniform_BIDMC_seed7"] == \
        f"AMD avx2 [{NEW}]"
    assert families["prostate_fedavg_BIDMC_seed0"] == "AMD avx2", "the older seeds keep theirs"


def test_a_machine_measured_to_repeat_a_family_signs_its_runs_into_it_naming_its_own_signature(folder, tmp_path):
    """The 25/1 machine repeats the 23/49 machine's runs (feddg.numerics.SAME_NUMBERS): its window keeps its own
    signature, and its runs join seed 6's family; the tables name both signatures."""
    own = "25/1 L1d 32K L2 512K L3 32M"
    session = _session_run(folder, "prostate_uniform_UCL_seed6", 6, START + 900)
    window = cpu_window.probe_window(folder, _probe(tmp_path, folder / "runs/prostate_fedavg_BIDMC_seed6/run.json"),
                                     START, UNTIL, {**HERE, "cpu_signature": own})
    assert window["signature"] == own and "founds" not in window["probe"]
    # the session's own run as the probe's reference: seed 6's family is held outside the window, so none is founded
    own_reference = cpu_window.probe_window(folder, _probe(tmp_path, session), START, UNTIL,
                                            {**HERE, "cpu_signature": own})
    assert "founds" not in own_reference["probe"] and own_reference["signature"] == own
    assert cpu_window.add_window(folder, window) == [f"runs/{session.parent.name}"]
    records = run_records(folder)
    assert records["prostate_uniform_UCL_seed6"]["executor"]["cpu_signature"] == own
    assert run_family(records["prostate_uniform_UCL_seed6"]) == run_family(records["prostate_fedavg_BIDMC_seed6"])
    assert runs_by_family(list(records.values()))[f"AMD avx2 [{SIGNATURE}]"]["made_on"] == {SIGNATURE: 1, own: 1}
    assert f"AMD avx2 [{SIGNATURE}] (2 runs; seed 6; made on {SIGNATURE} (1 run), {own} (1 run))" in \
        families_of_runs(list(records.values()))


def test_a_window_that_would_sign_runs_of_a_seed_another_family_holds_is_refused(folder, tmp_path):
    """A session that probed one of its own runs of seed 0 (the unsigned family's) would move it out of seed 0's
    family: refused, so such a machine makes a seed of its own."""
    reference = _session_run(folder, "prostate_uniform_BIDMC_seed0", 0, START + 900)
    timeline = (folder / CPU_TIMELINE).read_bytes()
    window = cpu_window.probe_window(folder, _probe(tmp_path, reference), START, UNTIL,
                                     {**HERE, "cpu_signature": NEW})
    with pytest.raises(ConfigError, match="prostate_uniform_BIDMC_seed0 \\(seed 0: AMD avx2\\)"):
        cpu_window.add_window(folder, window)
    assert (folder / CPU_TIMELINE).read_bytes() == timeline


def test_a_window_that_overlaps_a_signed_one_or_holds_another_machines_run_is_refused_unwritten(folder, tmp_path):
    probe = _probe(tmp_path, folder / "runs/prostate_fedavg_BIDMC_seed6/run.json")
    timeline = (folder / CPU_TIMELINE).read_bytes()
    signed = json.loads(timeline)["windows"][0]
    overlapping = cpu_window.probe_window(folder, probe, signed["until"] - 60, UNTIL, HERE)
    with pytest.raises(ConfigError, match="overlaps windows\\[0\\]"):
        cpu_window.add_window(folder, overlapping)
    intel = {**_record("prostate_fedavg_RUNMC_seed3"), "ended_at": START + 10}
    intel["executor"] = {k: v for k, v in intel["executor"].items() if k not in ("cpu", "avx512")} | \
        {"cpu": "Intel Xeon", "avx512": True}
    _put(folder, "prostate_fedavg_RUNMC_seed3", intel)
    with pytest.raises(ConfigError, match="prostate_fedavg_RUNMC_seed3"):
        cpu_window.add_window(folder, cpu_window.probe_window(folder, probe, START, UNTIL, HERE))
    (folder / "runs" / "prostate_fedavg_RUNMC_seed3" / "run.json").unlink()
    early = {**_record("prostate_uniform_BMC_seed6"), "run_id": "prostate_uniform_UCL_seed6", "ended_at": START + 50}
    early["executor"] = {k: v for k, v in early["executor"].items() if k != "cpu_signature"}
    _put(folder, "prostate_uniform_UCL_seed6", early)
    with pytest.raises(ConfigError, match="would sign \\['runs/prostate_uniform_UCL_seed6'\\], which ended before"):
        cpu_window.add_window(folder, cpu_window.probe_window(folder, probe, START, UNTIL, HERE))
    assert (folder / CPU_TIMELINE).read_bytes() == timeline, "the timeline is as it was"


def test_the_command_writes_the_window_and_refuses_in_one_line(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpu_window, "host_cpu", lambda: dict(HERE))
    probe = tmp_path / "same"
    probe.mkdir()
    (probe / cpu_window.SAME_CELL_FILE).write_text(
        json.dumps(_probe(tmp_path, folder / "runs/prostate_fedavg_BIDMC_seed6/run.json")))
    assert cpu_window.main([str(folder), "--probe", str(probe), "--from", "2030-03-17T17:46:40Z",
                            "--until", str(UNTIL)]) == 0
    first = json.loads((folder / CPU_TIMELINE).read_text())["windows"][0]
    assert (first["from"], first["until"]) == (START, UNTIL) and first["signature"] == SIGNATURE
    assert "it signs 0 run(s): none yet" in capsys.readouterr().out
    assert cpu_window.main([str(tmp_path / "nothing"), "--probe", str(probe), "--from", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"refused: {tmp_path / 'nothing'}: not a results folder")
    (folder / CPU_TIMELINE).write_text("{not json")
    assert cpu_window.main([str(folder), "--probe", str(probe), "--from", str(START), "--until", str(UNTIL)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refused: ") and CPU_TIMELINE in err and len(err.strip().splitlines()) == 1
