"""The shared launcher (:mod:`feddg.benchmark.launch`) against NVFlare's port race, with a stand-in for the
simulator that behaves as NVFlare 2.9's did when a site worker's port was taken (measured: the worker's
``Address already in use`` a few seconds in, then the run waits for ever)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from feddg.benchmark import launch
from feddg.benchmark.launch import PORT_RACE, SimulatorRun, run_simulator
from feddg.process_tree import alive

# argv: state folder, workspace, the starts that lose the race. The race's line comes in two writes, as a log can.
STAND_IN = r'''
import json, os, sys, time
state, ws, races = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(state, exist_ok=True)
starts = len(os.listdir(state)) + 1
with open(os.path.join(state, f"start{starts}.json"), "w") as f:
    json.dump({"pid": os.getpid()}, f)
os.makedirs(ws, exist_ok=True)
open(os.path.join(ws, f"from_start{starts}"), "w").close()
if starts <= races:
    print("ERROR - Execute exception: OSError: [Errno 98] Address", end="", flush=True)
    time.sleep(0.3)
    print(" already in use", flush=True)
    time.sleep(600)
if races < 0:
    sys.exit(3)
print("done", flush=True)
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(launch, "POLL_S", 0.05)

    def run(races: int, workspace: Path | None = None) -> SimulatorRun:
        ws = workspace or tmp_path / "ws"
        return SimulatorRun(tmp_path / "job", ws, tmp_path / "run.log",
                            command=[sys.executable, str(script), str(tmp_path / "state"), str(ws), str(races)])
    return run


def _starts(tmp_path: Path) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in sorted((tmp_path / "state").glob("start*.json"))]


def test_a_run_that_lost_the_port_race_is_stopped_at_once_and_started_again(tmp_path, stand_in):
    lines: list[str] = []
    begun = time.monotonic()
    ended = run_simulator(stand_in(races=1), timeout=300, label="cell", report=lines.append)
    assert time.monotonic() - begun < 60, "stopped on the race's line, not at its time limit"
    assert (ended.status, ended.returncode, ended.attempts) == ("ok", 0, 2)
    assert any(f"cell: the simulator lost a port to another process ({PORT_RACE})" in line and
               line.endswith("starting it again") for line in lines)
    first, _ = _starts(tmp_path)
    assert not alive(first), "the first start's process is gone"
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["from_start2"], \
        "the workspace the run made was cleared before its second start"
    assert (tmp_path / "run.log").read_text() == "done\n", "the log is the second start's"


def test_a_run_that_loses_the_race_twice_fails_naming_it(tmp_path, stand_in):
    begun = time.monotonic()
    ended = run_simulator(stand_in(races=2), timeout=300)
    assert time.monotonic() - begun < 60
    assert ended.status == "failed" and ended.attempts == 2 and ended.returncode != 0
    assert f"lost a port to another process ({PORT_RACE})" in ended.reason
    assert not any(alive(pid) for pid in _starts(tmp_path))


def test_any_other_failure_is_the_runs_own_and_not_run_again(tmp_path, stand_in):
    ended = run_simulator(stand_in(races=-1), timeout=300)
    assert (ended.status, ended.returncode, ended.attempts) == ("ok", 3, 1)
    assert len(_starts(tmp_path)) == 1


def test_a_workspace_that_was_there_before_the_run_is_left_to_the_command(tmp_path, stand_in):
    ws = tmp_path / "given"
    ws.mkdir()
    (ws / "users_file").write_text("keep")
    ended = run_simulator(stand_in(races=1, workspace=ws), timeout=300)
    assert ended.attempts == 2
    assert (ws / "users_file").read_text() == "keep"


def test_the_race_is_found_in_what_the_log_gained_since_the_last_look(tmp_path):
    run = SimulatorRun(tmp_path / "job", tmp_path / "ws", tmp_path / "log", command=["true"])
    run.log.write_text("x" * 5000 + "OSError: [Errno 98] Address alr")
    assert not run.lost_a_port()
    with open(run.log, "a") as f:
        f.write("eady in use\n")
    assert run.lost_a_port(), "the line written across two looks"
    assert run.lost_a_port(), "and it stays found"
