"""Runs per hour of the leave-one-site-out sweep on this machine with 1, 2, ... runs at once, back to back.

    python benchmarks/sweep_throughput.py [--task fundus] [--runs 4] [--rounds 20] [--parallel 1,2]
                                          [--out benchmarks/results/sweep_throughput] [--set KEY=VALUE ...]

For each ``--parallel N``, in the order given, one after the other on the same machine: ``feddg benchmark`` with
the same protocol (the task's sweep protocol with ``--rounds`` rounds and the ``--set`` settings, FedAvg, one
held-out site, ``--runs`` seeds) into a fresh results folder, ``--executor local --parallel N``. Measured: the
command's wall time from start to end (planning, every run, the tables), each run's own wall time, and the load
average of the machine before and after (the cores may be shared with other work: a measurement taken under load
says so). Runs per hour = runs / wall hours. The raw measurements go to ``sweep_throughput.json`` before the
Markdown table (``sweep_throughput.md``) is formatted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from feddg.benchmark.record import run_records
from feddg.benchmark.sweep import TIMING_HELD_OUT
from feddg.compute import available_cores
from feddg.folders import guard_folder
from feddg.jsonfile import write_json
from feddg.numbers import seconds
from feddg.report import machine_info, script_command, software_versions

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sweep_throughput"


def measure(task: str, runs: int, rounds: int, parallel: int, overrides: list[str], folder: Path,
            timeout: float) -> dict[str, Any]:
    """One sweep of ``runs`` FedAvg runs (seeds 0..runs-1) at ``parallel`` runs at once into ``folder``: its wall
    time, each run's, and the machine's load average around it."""
    command = [sys.executable, "-m", "feddg.cli", "benchmark", "--task", task, "--methods", "fedavg",
               "--held-out", TIMING_HELD_OUT[task], "--seeds", f"0-{runs - 1}", "--set", f"train.rounds={rounds}",
               *[x for o in overrides for x in ("--set", o)], "--resamples", "100", "--run-timeout", str(timeout),
               "--executor", "local", "--parallel", str(parallel), "--out", str(folder)]
    load_before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout * runs + 600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"--parallel {parallel}: feddg benchmark exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    records = list(run_records(folder).values())
    if len(records) != runs:  # run_records skips a record it cannot read: say so rather than count fewer runs
        raise RuntimeError(f"--parallel {parallel}: {len(records)} readable run records in {folder}, {runs} run")
    return {"parallel": parallel, "runs": len(records), "wall_s": round(wall, 3),
            "runs_per_hour": round(3600 * len(records) / wall, 2),
            "run_wall_s": [r["wall_s"] for r in records], "statuses": [r["status"] for r in records],
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "command": shlex.join(command[1:])}


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"# Sweep throughput: {results['task']}, {results['runs']} runs of {results['rounds']} rounds", "",
             f"`{results['command']}` on {m['cpu']} ({m['cores']} cores), measured back to back, in the order "
             f"below. Runs per hour = runs / the sweep command's wall time (planning and tables included).", "",
             "| runs at once | runs | wall (s) | runs per hour | mean run wall (s) | load average before -> after |",
             "|---|---|---|---|---|---|"]
    for s in results["sweeps"]:
        mean_run = sum(s["run_wall_s"]) / len(s["run_wall_s"])
        lines.append(f"| {s['parallel']} | {s['runs']} | {s['wall_s']:.0f} | {s['runs_per_hour']:.1f} | "
                     f"{mean_run:.0f} | {s['load_average_before'][0]:.1f} -> {s['load_average_after'][0]:.1f} |")
    base = results["sweeps"][0]
    for s in results["sweeps"][1:]:
        lines += ["", f"{s['parallel']} at once: {s['runs_per_hour'] / base['runs_per_hour']:.2f}x the runs per "
                      f"hour of {base['parallel']} at once."]
    first = results["sweeps"][0]["load_average_before"][0]  # later ones include the previous sweep's own work
    if first > 0.25 * m["cores"]:
        lines += ["", f"Taken under load: the 1-minute load average was {first:.1f} on {m['cores']} cores before the "
                      f"first sweep (other work shared the machine); later sweeps' \"before\" figures include the "
                      f"previous sweep's own processes."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="fundus", choices=sorted(TIMING_HELD_OUT))
    parser.add_argument("--runs", type=int, default=4, help="runs per sweep (seeds 0..runs-1; default 4)")
    parser.add_argument("--rounds", type=int, default=20, help="train.rounds of every run (default 20)")
    parser.add_argument("--parallel", default="1,2", help="the runs at once to compare, in order (default 1,2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a feddg.yaml setting of every run (repeatable)")
    parser.add_argument("--timeout", type=seconds, default=3600, help="seconds a run may take")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    parallels = [int(p) for p in args.parallel.split(",")]
    if args.runs < 1 or args.rounds < 1 or not parallels or min(parallels) < 1:
        parser.error("--runs, --rounds and every --parallel value must be positive")
    if max(parallels) > available_cores():
        parser.error(f"--parallel {max(parallels)}: more runs at once than this machine's {available_cores()} cores")

    try:
        out = guard_folder(args.out, "--out", whole=False)  # two files of its own, replaced by name
    except ValueError as e:
        parser.error(str(e))
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="feddg-sweep-throughput-"))
    results: dict[str, Any] = {"command": script_command("benchmarks/sweep_throughput.py", argv),
                               "task": args.task, "runs": args.runs, "rounds": args.rounds,
                               "overrides": args.overrides, "machine": machine_info(),
                               "versions": software_versions(), "sweeps": []}
    try:
        for parallel in parallels:
            print(f"--parallel {parallel}: {args.runs} runs of {args.rounds} rounds ...", flush=True)
            sweep = measure(args.task, args.runs, args.rounds, parallel, args.overrides, scratch / f"p{parallel}",
                            args.timeout)
            results["sweeps"].append(sweep)
            print(f"    {sweep['wall_s']:.0f} s, {sweep['runs_per_hour']:.1f} runs per hour", flush=True)
            # the raw measurements first, after every sweep: a later failure must not lose them
            write_json(out / "sweep_throughput.json", results, indent=2, finite=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = markdown(results)
    (out / "sweep_throughput.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
