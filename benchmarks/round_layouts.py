"""How the sweep's protocol run could be laid out on one host, timed side by side: which layout rounds fastest.

    python benchmarks/round_layouts.py --protocol prostate [--rounds 20] [--intervals 0.25,0.05] [--processes 2]
                                       [--no-poc] [--out /tmp/feddg/round_layouts] [--set KEY=VALUE]

Most of a protocol round that is not training is the wait for the next task (``benchmarks/round_time.py
--protocol``: task delivery 0.55 s of a 2.23 s prostate round). In NVFlare 2.9's simulator a site worker that asks
for a task and gets none sleeps a fixed 0.5 s before asking again (``simulator_worker.py``; no setting changes it),
while a real NVFlare client waits the server's ``task_request_interval``. So the levers a sweep has without changing
NVFlare are where the sites run and that interval. This runs the sweep's timing cell (the job of
``round_time.py --protocol``: FedAvg, seed 0, the sweep's rounds of one epoch, its CPU pin), ``--rounds`` rounds,
in each layout, one after the other on this host:

* ``simulator``: ``feddg simulate``, every site in its own process at once (the sweep's layout), at each of
  ``--intervals`` (the first is the jobs' own, :data:`feddg.flare.constants.TASK_REQUEST_INTERVAL`);
* ``poc``: the same job submitted to a local NVFlare POC of the task's sites (:mod:`feddg.poc`: real client
  processes, each asking for tasks as a deployment's do), at each interval; left out with ``--no-poc``;
* ``simulator -t N``: the simulator with N site processes (``--processes``), each taking the sites in turn with
  more threads (the cores shared by N instead of by every site).

Each layout's rounds come from the server's timings (median of round 1 on, the time between one round's task and
the next's) and its whole run from launch to exit (the POC's: submit to the end of the job as its admin sees it);
its per-case scores are compared bit for bit with the first layout's: a layout that changes them is not a runtime
setting. Prints a Markdown table and writes it, with every number, the command and the machine, to ``--out``
(``round_layouts.md``, ``round_layouts.json``, the JSON after each layout). A layout that fails is reported with
its reason and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from feddg.benchmark.cells import SWEEP_CPU_PIN
from feddg.benchmark.reproduce import case_scores_of
from feddg.benchmark.sweep import TIMING_HELD_OUT
from feddg.flare.constants import SIMULATOR_JOB, TASK_REQUEST_INTERVAL
from feddg.flare.timings import TIMINGS_FILE, read_timings, server_rounds
from feddg.folders import claim, guard_folder
from feddg.numbers import positive, seconds
from feddg.report import REPORT_FILE, machine_info, script_command, software_versions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from round_time import (job_experiment, run_federated, set_task_request_interval, site_timings,  # noqa: E402
                        write_protocol_job)


def median_round(timings: Path) -> tuple[float, int]:
    """The median time from one round's task to the next's, from round 1 on, and how many rounds that spans."""
    started = [r["started"] for r in server_rounds(read_timings(timings))]
    gaps = [b - a for a, b in zip(started[1:], started[2:])]
    if not gaps:
        raise RuntimeError(f"{timings}: fewer than 3 rounds timed, no round to take the median of")
    return statistics.median(gaps), len(gaps)


def last_site(workspace: Path) -> dict[str, float]:
    """A simulator round along its critical path, means over rounds 1 on (seconds): the wait of the round's last
    site (the last to return its result) for its task, from the server's task to the site's receipt
    (``last_site_wait_s``); that site's task, receipt to result (``last_site_task_s``); and its result to the next
    round's task (``after_last_s``). A POC's sites keep their timings at the sites: absent there."""
    server = {r["round"]: r for r in server_rounds(read_timings(workspace / "server" / SIMULATOR_JOB / TIMINGS_FILE))}
    sites = site_timings(workspace)
    parts: dict[str, list[float]] = {"last_site_wait_s": [], "last_site_task_s": [], "after_last_s": []}
    for r in sorted(server)[1:-1]:
        here = {site: records[r] for site, records in sites.items() if r in records}
        if not here or r + 1 not in server:
            continue
        last = max(here.values(), key=lambda t: t["returned"])
        parts["last_site_wait_s"].append(last["received"] - server[r]["started"])
        parts["last_site_task_s"].append(last["returned"] - last["received"])
        parts["after_last_s"].append(server[r + 1]["started"] - last["returned"])
    return {name: statistics.mean(values) for name, values in parts.items() if values}


def _only(paths: list[Path], what: str, where: Path) -> Path:
    if len(paths) != 1:
        raise RuntimeError(f"{len(paths)} {what} under {where}, expected one")
    return paths[0]


def measured(report_path: Path, timings: Path, wall_s: float) -> dict[str, Any]:
    round_s, rounds_timed = median_round(timings)
    report = json.loads(report_path.read_text())
    return {"wall_s": wall_s, "round_s": round_s, "rounds_timed": rounds_timed, "scores": case_scores_of(report)}


def job_with_interval(job_dir: Path, out: Path, interval: float) -> Path:
    """A copy of ``job_dir`` under ``out`` with the server's ``task_request_interval`` set to ``interval``."""
    copy = out / f"interval_{interval:g}" / job_dir.name
    shutil.copytree(job_dir, copy, dirs_exist_ok=True)
    set_task_request_interval(copy, interval)
    return copy


def in_simulator(job_dir: Path, workspace: Path, simulator_args: list[str], timeout: float,
                 env: dict[str, str]) -> dict[str, Any]:
    run = run_federated(job_dir, workspace, simulator_args, timeout, env)
    server = workspace / "server"
    return {**measured(_only(sorted(server.rglob(REPORT_FILE)), REPORT_FILE, server),
                       _only(sorted(server.rglob(TIMINGS_FILE)), TIMINGS_FILE, server), run["wall_s"]),
            **last_site(workspace)}


def in_poc(poc: Any, job_dir: Path, results: Path, timeout: float, refused: Exception | None) -> dict[str, Any]:
    from feddg import poc as harness

    if refused is not None:
        raise RuntimeError(f"the POC did not start: {refused}")

    started = time.monotonic()
    job_id = harness.submit(poc, job_dir)
    status = harness.wait(poc, job_id, timeout)
    wall_s = time.monotonic() - started
    if status != "FINISHED:COMPLETED":
        raise RuntimeError(f"job {job_id} ended {status}: {harness.server_errors(poc, job_id, results / job_id)}")
    report = harness.download(poc, job_id, results / job_id)
    return measured(report, _only(sorted((results / job_id).rglob(TIMINGS_FILE)), TIMINGS_FILE, results), wall_s)


def table(layouts: list[dict[str, Any]]) -> str:
    base = next((x for x in layouts if "round_s" in x), None)
    lines = ["| layout | task_request_interval s | whole run s | median round s | round / the sweep's | "
             "last site's wait for its task s | its task s | its result to the next task s | per-case scores |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in layouts:
        if "round_s" not in x:
            lines.append(f"| {x['layout']} | {x['interval']:g} | failed: {x['failed']} | | | | | | |")
            continue
        same = "the reference" if x is base else ("identical" if x["scores"] == base["scores"] else "DIFFER")
        path = " | ".join(f"{x[k]:.2f}" if k in x else "at the sites" for k in
                          ("last_site_wait_s", "last_site_task_s", "after_last_s"))
        lines.append(f"| {x['layout']} | {x['interval']:g} | {x['wall_s']:.1f} | {x['round_s']:.3f} | "
                     f"{x['round_s'] / base['round_s']:.2f} | {path} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = script_command("benchmarks/round_layouts.py", argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=sorted(TIMING_HELD_OUT), required=True,
                        help="the task whose sweep timing cell is run (FedAvg, seed 0, its timing site held out)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of every layout's run (default 20; 3 or more)")
    parser.add_argument("--intervals", default=f"{TASK_REQUEST_INTERVAL:g},0.05", metavar="S,S",
                        help="task_request_interval values, the jobs' own first (default %(default)s)")
    parser.add_argument("--processes", default="", metavar="N,N",
                        help="also run the simulator with these numbers of site processes (-t N), at the first "
                             "interval")
    parser.add_argument("--no-poc", action="store_true", help="leave out the POC layouts")
    parser.add_argument("--timeout", type=seconds, default=3600, help="seconds per run")
    parser.add_argument("--out", default="/tmp/feddg/round_layouts")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an experiment setting on top of the protocol's (repeatable; tiny settings for tests)")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: give 3 or more (the median skips round 0 and needs two gaps)")
    try:
        intervals = [positive(v) for v in args.intervals.split(",") if v.strip()]
        processes = [int(v) for v in args.processes.split(",") if v.strip()]
    except (ValueError, argparse.ArgumentTypeError) as e:
        parser.error(f"--intervals {args.intervals!r} / --processes {args.processes!r}: {e}")
    if not intervals or any(n < 1 for n in processes):
        parser.error("--intervals needs one value or more; --processes takes positive numbers")

    from feddg.config import ConfigError
    from feddg.experiment import parse_overrides
    from feddg.numerics import pinned_environment

    try:
        extra = parse_overrides(args.set)
        out = claim(guard_folder(args.out, "--out"), "benchmarks/round_layouts.py")  # workspaces are cleared
        job_dir = write_protocol_job(out / "jobs", args.protocol, args.rounds, extra)
    except (ConfigError, ValueError) as e:
        parser.error(str(e))
    env = pinned_environment(SWEEP_CPU_PIN)
    results: dict[str, Any] = {"command": command, "machine": machine_info(), "versions": software_versions(),
                               "job": job_dir.name, "rounds": args.rounds, "env": env, "layouts": []}

    def record(layout: str, interval: float, run) -> None:
        print(f"{layout}, task_request_interval {interval:g} s ...", flush=True)
        try:
            entry = {"layout": layout, "interval": interval, **run()}
        except Exception as e:  # noqa: BLE001 - one layout's failure is reported; the others still run
            entry = {"layout": layout, "interval": interval, "failed": str(e).splitlines()[0][:300]}
        results["layouts"].append(entry)
        (out / "round_layouts.json").write_text(json.dumps(results, indent=2, default=str) + "\n")

    jobs = {interval: job_with_interval(job_dir, out / "jobs", interval) for interval in intervals}
    for interval in intervals:
        record("simulator, every site at once", interval,
               lambda: in_simulator(jobs[interval], out / "workspace", [], args.timeout, env))
    if not args.no_poc:
        from feddg import poc as harness

        cfg = job_experiment(job_dir)
        os.environ.update(env)  # the POC's participants start with this process's environment, pinned as the sweep
        poc = harness.prepare(out / "poc", cfg.data.task, cfg.data.sites)
        try:
            try:
                harness.start(poc)
                refused = None
            except harness.RehearsalError as e:  # each POC layout is then reported failed, with the reason
                refused = e
            for interval in intervals:
                record("POC, every site a client process", interval,
                       lambda: in_poc(poc, jobs[interval], out / "poc_results", args.timeout, refused))
        finally:
            harness.stop(poc)  # every process it started, by id, whatever happened
    for n in processes:
        record(f"simulator -t {n}", intervals[0],
               lambda: in_simulator(jobs[intervals[0]], out / "workspace", ["-t", str(n)], args.timeout, env))

    m = results["machine"]
    lines = [f"# Where the sites of a {args.protocol} protocol run could run: {args.rounds} rounds each", "",
             f"`{command}` on {m['cpu']} ({m['cores']} cores), torch {results['versions']['torch']}; "
             f"{' '.join(f'{k}={v}' for k, v in env.items())}. One layout at a time on this host; the median round "
             "is from round 1 on; the scores are compared with the first row's.", "", table(results["layouts"]), ""]
    (out / "round_layouts.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if all("round_s" in x for x in results["layouts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
