"""What a task's full benchmark design costs at the papers' size, from a round time measured where it would run.

The full design of a task is every registered method that supports it x every held-out site x :data:`DESIGN_SEEDS`
seeds (prostate: 8 x 6 x 5 = 240 runs; fundus: 8 x 4 x 5 = 160). At the papers' size
(:data:`feddg.experiment.PAPER_SIZE`: 384 px, the papers' network, their round count) one run takes that many rounds of
the seconds one paper-size round takes, and only a measurement on the hardware that would run the sweep gives
those seconds: ``benchmarks/round_time.py --paper`` writes them (its ``round_time.json``). Copied into a sweep
folder as :data:`PAPER_ROUND_TIME`, the folder's ``results.json`` and ``results.md`` carry the design's
device-hours; without it they say "not measured" and how to measure it. A figure scaled from the folder's own
2-core CPU protocol (64 px, a small network) would be a guess, so none is made.

Two simplifications, stated wherever the figure is shown: one job's round time stands for every method's (the
task's GA job; methods that train more per round, such as ELCFS, take longer), and a run holds its device alone
(the simulator puts every site of the run on it), so device-hours are runs x rounds x round seconds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from feddg.jsonfile import read_json_object

DESIGN_SEEDS = 5  # seeds per cell in the full design (the benchmark issue's design: about 400 runs in all)
PAPER_ROUND_TIME = "paper_round_time.json"  # in a sweep folder: benchmarks/round_time.py --paper's round_time.json


def measure_command(task: str) -> str:
    """The command that measures the round time :func:`paper_size_cost` reads, for ``task``'s headline job (run it
    on the GPU that would run the sweep; its ``round_time.json`` is then copied in as :data:`PAPER_ROUND_TIME`)."""
    return f"python benchmarks/round_time.py --job {task}_ga --paper --rounds 4 --out /tmp/feddg/round_time -- -gpu 0"


def design_runs(task: str) -> int:
    """The runs of ``task``'s full design: its methods x held-out sites x :data:`DESIGN_SEEDS`."""
    from feddg.experiment import TASK_DEFAULTS
    from feddg.flare.registry import methods

    n_methods = sum(1 for m in methods().values() if m.supports(task))
    return n_methods * len(TASK_DEFAULTS[task]["data"]["sites"]) * DESIGN_SEEDS


def design_hours(runs: int, rounds: int, round_s: float) -> float:
    """Device-hours of ``runs`` runs of ``rounds`` rounds at ``round_s`` seconds a round, one run per device."""
    return runs * rounds * round_s / 3600


def paper_size_cost(task: str, round_time_file: Path) -> dict[str, Any]:
    """The cost of ``task``'s full design at the papers' size, from ``round_time_file`` (a paper-size
    ``round_time.json`` of ``task``'s jobs) when it exists; ``hours`` is None (not measured) when it does not.

    Raises ValueError naming the file and the field when the file is not a paper-size measurement of ``task``.
    """
    from feddg.experiment import PAPER_SIZE

    runs, rounds = design_runs(task), PAPER_SIZE["train"]["rounds"]
    cost: dict[str, Any] = {"design_runs": runs, "rounds": rounds, "seeds": DESIGN_SEEDS, "round_s": None,
                            "device": None, "gpu": None, "hours": None, "measured_by": None,
                            "measure": measure_command(task)}
    if not round_time_file.exists():
        return cost
    measured = read_json_object(round_time_file)  # ValueError naming the file when it is not a JSON object
    if measured.get("paper") is not True:
        raise ValueError(f"{round_time_file}: 'paper' is {measured.get('paper')!r}; the design's cost needs a "
                         f"paper-size round time (benchmarks/round_time.py --paper)")
    if not (isinstance(measured.get("job"), str) and measured["job"].startswith(f"{task}_")):
        raise ValueError(f"{round_time_file}: 'job' is {measured.get('job')!r}, not a {task} job")
    summary, machine = measured.get("federated_summary"), measured.get("machine")
    round_s = summary.get("round_s") if isinstance(summary, dict) else None
    if isinstance(round_s, bool) or not isinstance(round_s, (int, float)) or not (math.isfinite(round_s)
                                                                                  and round_s > 0):
        raise ValueError(f"{round_time_file}: 'federated_summary.round_s' is {round_s!r}; a round time is a "
                         f"positive, finite number of seconds")
    if not isinstance(machine, dict):
        raise ValueError(f"{round_time_file}: 'machine' is {machine!r}, not an object naming the device")
    for key in ("gpu", "cpu"):
        if key in machine and not (isinstance(machine[key], str) and machine[key].strip()):
            raise ValueError(f"{round_time_file}: 'machine.{key}' is {machine[key]!r}, not a device's name")
    command = measured.get("command")
    if command is not None and not isinstance(command, str):
        raise ValueError(f"{round_time_file}: 'command' is {command!r}, not the command line that measured it")
    gpu = "gpu" in machine
    return {**cost, "round_s": float(round_s), "device": machine["gpu"] if gpu else
            f"{machine.get('cpu', '?')} (CPU)", "gpu": gpu, "hours": design_hours(runs, rounds, float(round_s)),
            "measured_by": command}


def cost_line(cost: dict[str, Any]) -> str:
    """:func:`paper_size_cost` as one sentence for results.md."""
    design = (f"The full design at the papers' size ({cost['design_runs']} runs: every method x held-out site x "
              f"{cost['seeds']} seeds, {cost['rounds']} rounds each)")
    if cost["hours"] is None:
        return (f"{design}: cost not measured. To measure it, run `{cost['measure']}` on the GPU that would run the "
                f"sweep and copy its `round_time.json` into this folder as `{PAPER_ROUND_TIME}`.")
    unit = "GPU-hours" if cost["gpu"] else "CPU-hours"
    return (f"{design}: {cost['hours']:.0f} {unit} on {cost['device']}, one run per device at a time "
            f"({cost['round_s']:.2f} s a round, measured by `{cost['measured_by']}`; the GA job's round time "
            f"stands for every method's, so methods that train more per round take longer).")


__all__ = ["DESIGN_SEEDS", "PAPER_ROUND_TIME", "cost_line", "design_hours", "design_runs", "measure_command",
           "paper_size_cost"]
