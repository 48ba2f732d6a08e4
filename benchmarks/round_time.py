"""Where a federated round's time goes, next to the same local training done outside NVFlare, in one run.

    python benchmarks/round_time.py [--job prostate_ga] [--rounds 4] [--out /tmp/feddg/round_time]
                                    [--compare-interval 2.0] [--paper --cases-per-site 30] [--set KEY=VALUE]
                                    [-- SIMULATOR ARGS]
    python benchmarks/round_time.py --protocol fundus|prostate [--rounds N] [--skip-local] [--out DIR]

1. Writes the job from the template (``feddg.jobs``) with ``train.rounds`` and, with ``--paper``, the papers'
   setting (384 px, the paper's network, batch 5, one epoch) and ``--cases-per-site`` synthetic volumes per site,
   then runs it with ``feddg simulate`` (every site in its own process, all at once, each with its share of the
   cores; extra simulator arguments after ``--``, e.g. ``-- -gpu 0``). With ``--protocol TASK`` the job is the
   sweep's own timing cell instead (``feddg.benchmark.sweep.timing_cell``: FedAvg, seed 0, the sweep's rounds of
   one local epoch at the task's image size, its CPU pin), the run a benchmark sweep repeats hundreds of times;
   the whole run is then also broken into its parts: start-up until round 0's task, the rounds, the end-of-run
   evaluation, the report and the exit. With ``--anchors`` it also runs NVFlare's own trivial job and NVFlare's
   PyTorch FedAvg recipe on the same U-Net, data and thread budget (:mod:`anchors`) and prints our round against
   theirs as ratios.
2. Reads the timings the server and each site wrote (:mod:`feddg.flare.timings`) and breaks every round down:
   the slowest site's validation and training (and the part of the training spent producing batches), the task's
   delivery to the sites, the sites' other work in the task (loading the received weights, optimizer state,
   GA's post-training loss, the weights' conversion), the results' filtering, serialization and transfer, the
   server's aggregation and checkpoint, and the orchestration: the round minus the slowest site's validation and
   training.
3. Runs the same local training outside NVFlare: one process per training site, started together, with the same
   thread budget, the same data, network, batches and epochs, validating and training once per round (rounds in
   step, a barrier between them). The ratio of the federated round to this local round is NVFlare's price.
4. With ``--compare-interval S``, runs the federated job a second time with NVFlare's ``task_request_interval``
   set to S (NVFlare's default is 2.0) for a side-by-side comparison with the jobs' value.

Round 0 also loads each site's data and imports the optimizer's dependencies (``torch.optim`` imports
``torch._dynamo`` on first use: 1.8 s of CPU on this machine); the summary's means are over rounds 1 and later.
Prints Markdown tables and writes them, with every number, the command and the machine, to ``--out``
(``round_time.md``, ``round_time.json``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

from feddg.benchmark.cells import SWEEP_CPU_PIN
from feddg.benchmark.launch import SimulatorRun, run_simulator
from feddg.benchmark.sweep import TIMING_HELD_OUT
from feddg.compute import SITE_PROCESSES_ENV
from feddg.config import FedDGConfig
from feddg.flare.constants import SIMULATOR_JOB
from feddg.flare.timings import TIMINGS_FILE, read_timings, server_phases, server_rounds
from feddg.folders import claim, guard_folder
from feddg.numbers import positive, seconds
from feddg.report import machine_info, script_command, software_versions


# ------------------------------------------------------------------------------------------------ the job


def job_experiment(job_dir: Path) -> FedDGConfig:
    """A job folder's validated ``feddg.yaml``, its method's section included."""
    from feddg.experiment import load_experiment
    from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections

    return load_experiment(job_dir / "app" / "config" / "feddg.yaml")


def write_benchmark_job(out: Path, job: str, rounds: int, paper: bool, cases_per_site: int | None,
                        extra: dict[str, Any] | None = None) -> Path:
    from feddg.experiment import PAPER_SIZE, merge
    from feddg.recipes.export import write_job

    overrides: dict[str, Any] = merge(extra or {}, {"train": {"rounds": rounds}})
    if paper:
        overrides = merge(PAPER_SIZE, overrides)
    if cases_per_site is not None:
        overrides = merge(overrides, {"data": {"synthetic": {"cases_per_site": cases_per_site}}})
    return write_job(out, job, overrides)


def set_task_request_interval(job_dir: Path, seconds: float) -> None:
    path = job_dir / "app" / "config" / "config_fed_server.json"
    config = json.loads(path.read_text())
    config.setdefault("server", {})["task_request_interval"] = seconds
    path.write_text(json.dumps(config, indent=2) + "\n")


def write_protocol_job(out: Path, task: str, rounds: int | None, extra: dict[str, Any] | None = None) -> Path:
    """The job of the sweep's timing cell for ``task`` (:func:`feddg.benchmark.sweep.timing_cell`: FedAvg, seed 0,
    its held-out site, the sweep's protocol), with ``rounds`` rounds instead of the protocol's when given and the
    ``extra`` settings on top (``--set``: a tiny setting for tests)."""
    from feddg.benchmark.protocol import run_overrides
    from feddg.benchmark.sweep import timing_cell
    from feddg.experiment import merge
    from feddg.recipes.export import write_job

    protocol, run = timing_cell(task)
    overrides = merge(run_overrides(protocol, run), extra or {})
    if rounds is not None:
        overrides = merge(overrides, {"train": {"rounds": rounds}})
    return write_job(out, f"{run.task}_{run.method}", overrides)


def run_federated(job_dir: Path, workspace: Path, simulator_args: list[str], timeout: float,
                  env: dict[str, str] | None = None) -> dict[str, Any]:
    """One simulator run of ``job_dir`` and its breakdown; RuntimeError naming the log when it fails or times out
    (what it measured is still read: ``partial`` in the error's ``args[1]``)."""
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.parent.mkdir(parents=True, exist_ok=True)
    log = workspace.parent / f"{workspace.name}.log"
    # the shared launcher: its own session, and on a timeout every process it started is stopped, site workers too;
    # a run that lost NVFlare's port race is started once more, and the breakdown is the last start's
    ended = run_simulator(SimulatorRun(job_dir, workspace, log, simulator_args, env=env), timeout)
    exited = time.time()
    launched = exited - ended.wall_s
    if ended.status != "ok" or ended.returncode != 0:
        try:
            partial = breakdown(workspace, launched, exited)
        except RuntimeError:
            partial = {}
        raise RuntimeError(f"the simulator run {ended.reason or f'failed (exit {ended.returncode})'}"
                           f"{_silent_sites(workspace)}; see {log}", partial)
    return {"wall_s": ended.wall_s, "log": str(log), "simulator_starts": ended.attempts,
            **breakdown(workspace, launched, exited)}


def _silent_sites(workspace: Path) -> str:
    """``": no result from SITE, ..."`` for the training sites whose timings stop before the server's last round."""
    server = server_rounds(read_timings(workspace / "server" / SIMULATOR_JOB / TIMINGS_FILE))
    if not server:
        return ""
    last = server[-1]
    silent = sorted(set(site_timings(workspace)) - set(last.get("results", {})))
    return f": no result in round {last['round']} from {', '.join(silent)}" if silent else ""


def site_timings(workspace: Path) -> dict[str, dict[int, dict]]:
    """Site -> round -> its training task's timings record, from each site's timings file in a simulator workspace."""
    sites: dict[str, dict[int, dict]] = {}
    for path in sorted(workspace.glob(f"*/{SIMULATOR_JOB}/feddg_site_state/{TIMINGS_FILE}")):
        sites[path.parts[-4]] = {r["round"]: r for r in read_timings(path) if r.get("task") == "train"}
    return sites


# ------------------------------------------------------------------------------------------------ the breakdown


def breakdown(workspace: Path, launched: float | None = None, exited: float | None = None) -> dict[str, Any]:
    """Per-round figures from the timings files of a simulator workspace, and the run's parts outside the rounds
    (:func:`run_phases`) when the launch and exit times are given."""
    records = read_timings(workspace / "server" / SIMULATOR_JOB / TIMINGS_FILE)
    server = server_rounds(records)
    if not server:
        raise RuntimeError(f"no server timings under {workspace}: did the job run its rounds?")
    sites = site_timings(workspace)
    rounds = []
    for s in server:
        r = s["round"]
        here = {site: recs[r] for site, recs in sites.items() if r in recs}
        if not here:
            continue
        busy = {site: t["validation_s"] + t["training_s"] for site, t in here.items()}
        slowest = max(busy, key=busy.get)
        t = here[slowest]
        round_s = s["ended"] - s["started"]
        rounds.append({
            "round": r,
            "round_s": round_s,
            "slowest_site": slowest,
            "validation_s": t["validation_s"],
            "training_s": t["training_s"],
            "data_s": t["data_s"],
            "setup_s": max(x["setup_s"] for x in here.values()),
            "delivery_s": max(x["received"] - s["started"] for x in here.values()),
            "site_other_s": (t["returned"] - t["received"]) - t["setup_s"] - busy[slowest],
            "transfer_s": max(s["results"][site] - x["returned"] for site, x in here.items() if site in s["results"]),
            "after_results_s": s["ended"] - s["results_in"],
            "aggregation_s": s["aggregation_s"],
            "save_s": s["save_s"],
            "orchestration_s": round_s - busy[slowest],
        })
    peak_sites = {site: max(x["peak_rss_mib"] for x in recs.values()) for site, recs in sites.items() if recs}
    out = {"rounds": rounds, "peak_rss_mib": {"server": max(s["peak_rss_mib"] for s in server), **peak_sites}}
    if launched is not None and exited is not None:
        out["phases"] = run_phases(server, server_phases(records), launched, exited)
    return out


PHASES = [("start_up_s", "start-up (launch to round 0's task)"), ("site_info_s", "of which the sites' version check"),
          ("rounds_s", "rounds"), ("evaluation_s", "end-of-run evaluation (final and best model, every site)"),
          ("report_s", "report"), ("exit_s", "exit (report to the last process gone)"), ("wall_s", "whole run")]


def run_phases(server: list[dict], phases: dict[str, dict], launched: float, exited: float) -> dict[str, float]:
    """A whole run in parts (seconds, :data:`PHASES`): from the launch of ``feddg simulate`` to round 0's task,
    the rounds, the evaluations after them, the report, and the exit; a part the timings do not hold is absent."""
    def span(name: str) -> float | None:
        record = phases.get(name)
        return record["ended"] - record["started"] if record else None

    out = {"start_up_s": server[0]["started"] - launched, "rounds_s": server[-1]["ended"] - server[0]["started"],
           "wall_s": exited - launched}
    evaluations = [x for x in (span("evaluate_final"), span("evaluate_best")) if x is not None]
    for key, value in (("site_info_s", span("site_info")), ("report_s", span("report")),
                       ("evaluation_s", sum(evaluations) if evaluations else None)):
        if value is not None:
            out[key] = value
    if "report" in phases:
        out["exit_s"] = exited - phases["report"]["ended"]
    return out


def phases_table(phases: dict[str, float]) -> str:
    lines = ["| part of the run | seconds | share |", "|---|---|---|"]
    lines += [f"| {label} | {phases[key]:.1f} | {100 * phases[key] / phases['wall_s']:.0f} % |"
              for key, label in PHASES if key in phases]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ local training


def _local_site(job_dir: str, site: str, rounds: int, barrier, queue) -> None:
    """One training site's local training outside NVFlare: validation and training once per round."""
    import copy

    import torch

    from feddg.compute import apply_thread_budget
    from feddg.data.dataset import load_site, make_loader
    from feddg.evaluation import validation_scores
    from feddg.nets.unet import build_model, select_device
    from feddg.precision import Precision
    from feddg.seeds import round_seed
    from feddg.training import local_optimizer, train_epochs

    apply_thread_budget()
    cfg = job_experiment(Path(job_dir))
    device = select_device()
    data = load_site(cfg.data, site)
    model = build_model(cfg).to(device)
    optimizer = local_optimizer(model.parameters(), cfg.train.lr)
    precision = Precision(cfg.train.amp, device)
    for r in range(rounds):
        barrier.wait(timeout=3600)
        started = time.time()
        if len(data["val"]):
            validation_scores(model, data["val"], cfg.data.label_names, device, cfg.eval.batch_size)
        seed = round_seed(cfg.train.seed, site, r)
        loader = make_loader(data["train"], cfg.train.batch_size, True, cfg.train.augment, seed, device)
        t = cfg.train
        global_model = copy.deepcopy(model).eval() if t.fedprox_mu > 0 else None
        train_epochs(model, loader, optimizer, t.local_epochs, device, t.fedprox_mu, global_model, t.local_steps,
                     precision)
        if device.type == "cuda":
            torch.cuda.synchronize()
        queue.put((site, r, started, time.time()))


def run_local(job_dir: Path, rounds: int, site_processes: int, timeout: float) -> dict[str, Any]:
    """Every training site's local training at once, rounds in step; per round the wall time until the last site
    is done."""

    cfg = job_experiment(job_dir)
    sites = cfg.data.train_sites
    ctx = mp.get_context("spawn")  # a fresh interpreter per site, as NVFlare's site processes
    barrier, queue = ctx.Barrier(len(sites)), ctx.Queue()
    os.environ[SITE_PROCESSES_ENV] = str(site_processes)
    procs = [ctx.Process(target=_local_site, args=(str(job_dir), s, rounds, barrier, queue)) for s in sites]
    for p in procs:
        p.start()
    records = [queue.get(timeout=timeout) for _ in range(len(sites) * rounds)]
    for p in procs:
        p.join(timeout=60)
    per_round = []
    for r in range(rounds):
        spans = [(start, end) for _, rr, start, end in records if rr == r]
        per_round.append({"round": r, "round_s": max(e for _, e in spans) - min(s for s, _ in spans)})
    return {"sites": sites, "rounds": per_round}


# ------------------------------------------------------------------------------------------------ report

COLUMNS = [("round", "round"), ("round_s", "round s"), ("validation_s", "validation"), ("training_s", "training"),
           ("data_s", "of which data"), ("delivery_s", "task delivery"), ("site_other_s", "site other"),
           ("transfer_s", "result transfer"), ("aggregation_s", "aggregation"), ("save_s", "checkpoint"),
           ("orchestration_s", "orchestration")]


def round_table(rounds: list[dict], local: dict[int, float] | None) -> str:
    head = [label for _, label in COLUMNS] + (["local round s", "federated / local"] if local else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rounds:
        cells = [str(r["round"])] + [f"{r[key]:.2f}" for key, _ in COLUMNS[1:]]
        if local:
            cells += [f"{local[r['round']]:.2f}", f"{r['round_s'] / local[r['round']]:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(run: dict, local: dict[int, float] | None) -> dict[str, float]:
    later = [r for r in run["rounds"] if r["round"] > 0] or run["rounds"]
    out = {key: mean(r[key] for r in later) for key, _ in COLUMNS[1:]}
    out["shares"] = {key: out[key] / out["round_s"] for key in ("validation_s", "training_s", "orchestration_s")}
    if local:
        out["local_round_s"] = mean(local[r["round"]] for r in later)
        out["federated_over_local"] = out["round_s"] / out["local_round_s"]
    return out


def anchor_table(federated: dict[str, Any], anchored: dict[str, Any]) -> str:
    """Our median round (rounds 1+) and what of it is not training, against each anchor's median round."""
    later = [r for r in federated["rounds"] if r["round"] > 0] or federated["rounds"]
    ours = statistics.median(r["round_s"] for r in later)
    not_training = statistics.median(r["round_s"] - r["training_s"] for r in later)
    lines = ["| round (median, rounds 1+) | seconds | ours / it | ours not training / it |", "|---|---|---|---|",
             f"| ours | {ours:.2f} | 1.00 | |"]
    labels = {"trivial": "NVFlare's trivial job (ScatterAndGather, NumPy, nothing to compute)",
              "recipe": "NVFlare's PyTorch FedAvg recipe (same U-Net, data, batches, threads)"}
    for name, label in labels.items():
        found = anchored.get(name, {})
        if "skipped" in found:
            lines.append(f"| {label} | skipped: {found['skipped']} | | |")
            continue
        lines.append(f"| {label} | {found['round_s']:.2f} | {ours / found['round_s']:.2f} | "
                     f"{not_training / found['round_s']:.2f} |")
    lines += ["", f"Ours not training (the round minus the slowest site's training, median): {not_training:.2f} s."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = script_command("benchmarks/round_time.py", argv)
    simulator_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default="prostate_ga", help="a job of the template (default: the headline job)")
    parser.add_argument("--protocol", choices=sorted(TIMING_HELD_OUT),
                        help="time the sweep's protocol run of this task instead of --job (FedAvg, seed 0, held out "
                             "at its timing site, the sweep's rounds of one local epoch, CPU pinned as the sweep)")
    parser.add_argument("--rounds", type=int, help="rounds (default: 4, or the protocol's with --protocol)")
    parser.add_argument("--paper", action="store_true", help="the papers' setting (384 px, batch 5, one epoch)")
    parser.add_argument("--cases-per-site", type=int, help="synthetic volumes per site (the papers: about 30)")
    parser.add_argument("--compare-interval", type=positive, help="also run with this task_request_interval")
    parser.add_argument("--skip-local", action="store_true", help="do not run the local-training baseline")
    parser.add_argument("--anchors", action="store_true",
                        help="also run NVFlare's own trivial job and its PyTorch FedAvg recipe on the same U-Net, data "
                             "and thread budget (benchmarks/anchors.py) and compare our round with theirs")
    parser.add_argument("--anchor-rounds", type=int, default=20, help="rounds of each anchor job (default 20)")
    parser.add_argument("--timeout", type=seconds, default=3600, help="seconds per run")
    parser.add_argument("--out", default="/tmp/feddg/round_time")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an experiment setting on top of the job's or the protocol's (repeatable)")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    if args.protocol and (args.paper or args.cases_per_site is not None):
        parser.error("--protocol runs the sweep's protocol as it is: leave out --paper and --cases-per-site")

    from feddg.config import ConfigError
    from feddg.experiment import parse_overrides

    try:
        extra = parse_overrides(args.set)
        out = claim(guard_folder(args.out, "--out"), "benchmarks/round_time.py")  # its workspace is cleared each run
    except (ConfigError, ValueError) as e:
        parser.error(str(e))
    env: dict[str, str] = {}
    try:
        if args.protocol:
            from feddg.numerics import pinned_environment

            job_dir = write_protocol_job(out / "jobs", args.protocol, args.rounds, extra)
            env = pinned_environment(SWEEP_CPU_PIN)
            name = f"the {args.protocol} protocol ({job_dir.name})"
        else:
            job_dir = write_benchmark_job(out / "jobs", args.job, args.rounds or 4, args.paper, args.cases_per_site,
                                          extra)
            name = args.job
    except ConfigError as e:
        parser.error(str(e))
    from feddg.simulate import simulator_threads
    from feddg.flare.constants import TASK_REQUEST_INTERVAL

    rounds = job_experiment(job_dir).train.rounds
    _, site_processes = simulator_threads(job_dir, simulator_args)
    print(f"federated: {job_dir} in the simulator ({site_processes} site processes at once) ...", flush=True)
    results: dict[str, Any] = {
        "command": command, "machine": machine_info(), "versions": software_versions(), "job": job_dir.name,
        "protocol": args.protocol, "rounds": rounds, "paper": args.paper, "cases_per_site": args.cases_per_site,
        "site_processes": site_processes, "task_request_interval": TASK_REQUEST_INTERVAL, "env": env}
    try:
        federated = run_federated(job_dir, out / "workspace", simulator_args, args.timeout, env)
    except RuntimeError as e:  # what it measured before the failure is kept, and the failure named
        partial = e.args[1] if len(e.args) > 1 else {}
        (out / "round_time.json").write_text(json.dumps({**results, "failed": e.args[0], "federated": partial},
                                                        indent=2, default=str) + "\n")
        print(f"round_time: {e.args[0]} (what it measured: {out / 'round_time.json'})", file=sys.stderr)
        return 1
    local = None
    if not args.skip_local:
        print("local: the same training outside NVFlare ...", flush=True)
        local_run = run_local(job_dir, rounds, site_processes, args.timeout)
        local = {r["round"]: r["round_s"] for r in local_run["rounds"]}
    compared = None
    if args.compare_interval is not None:
        other = out / "jobs_interval" / job_dir.name
        shutil.copytree(job_dir, other, dirs_exist_ok=True)
        set_task_request_interval(other, args.compare_interval)
        print(f"federated again with task_request_interval {args.compare_interval} s ...", flush=True)
        compared = run_federated(other, out / "workspace_interval", simulator_args, args.timeout, env)

    anchored = None
    if args.anchors:
        import anchors

        train_sites = job_experiment(job_dir).data.train_sites
        anchored = anchors.measure(out / "anchors", job_dir / "app" / "config" / "feddg.yaml", train_sites,
                                   max(args.anchor_rounds, 3), args.timeout)
    results.update(federated=federated, federated_summary=summary(federated, local), local=local, anchors=anchored)
    # The raw measurements first: a formatting error must not lose minutes of measuring.
    (out / "round_time.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    m = results["machine"]
    shown = federated["rounds"] if len(federated["rounds"]) <= 12 else federated["rounds"][:4] + federated["rounds"][-2:]
    lines = [f"# Round time: {name}, {rounds} rounds{' (paper size)' if args.paper else ''}", "",
             f"`{command}` on {m['cpu']} ({m['cores']} cores{', ' + m['gpu'] if 'gpu' in m else ''}), "
             f"torch {results['versions']['torch']}; {site_processes} site processes at once"
             + (f"; {' '.join(f'{k}={v}' for k, v in env.items())}" if env else "") + ". Seconds; the site "
             f"columns are the slowest site's (largest validation + training).", "",
             f"Whole simulator run: {federated['wall_s']:.1f} s. NVFlare task_request_interval "
             f"{TASK_REQUEST_INTERVAL} s."
             + (" Its first start lost NVFlare's port race and was stopped; the times are its second start's."
                if federated.get("simulator_starts", 1) > 1 else ""), ""]
    if "phases" in federated:
        lines += [phases_table(federated["phases"]), ""]
    lines += [("Rounds 0-3 and the last two:" if shown is not federated["rounds"] else "Every round:"), "",
              round_table(shown, local), ""]
    s = results["federated_summary"]
    lines += [f"Mean over rounds 1+: round {s['round_s']:.2f} s; validation {100 * s['shares']['validation_s']:.0f} %,"
              f" training {100 * s['shares']['training_s']:.0f} %, orchestration {s['orchestration_s']:.2f} s "
              f"({100 * s['shares']['orchestration_s']:.0f} %); not training (the round minus the slowest site's "
              f"training) {s['round_s'] - s['training_s']:.2f} s"
              + (f"; local round {s['local_round_s']:.2f} s, federated / local {s['federated_over_local']:.2f}"
                 if local else "") + ".", "",
             "Peak resident memory (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in federated["peak_rss_mib"].items())
             + " (the server line is the simulator's main process, which also hosts the clients' proxies).", ""]
    if anchored is not None:
        lines += ["## Against NVFlare's own rounds, same machine, same run", "", anchor_table(federated, anchored), ""]
    if compared is not None:
        c = summary(compared, None)
        results["compared_interval"] = {"task_request_interval": args.compare_interval, "run": compared,
                                        "summary": c}
        lines += [f"## The same job with task_request_interval {args.compare_interval} s", "",
                  f"Whole run {compared['wall_s']:.1f} s (vs {federated['wall_s']:.1f} s); mean round "
                  f"{c['round_s']:.2f} s (vs {s['round_s']:.2f} s), orchestration {c['orchestration_s']:.2f} s "
                  f"(vs {s['orchestration_s']:.2f} s).", "", round_table(compared["rounds"], None), ""]
    (out / "round_time.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
