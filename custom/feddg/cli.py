"""The ``feddg`` command: tools for hospitals and researchers around the federated jobs.

    feddg check-data   check a site's data folder before joining (read-only)
    feddg synth        write the synthetic multi-site data set to a folder
    feddg evaluate     score a saved global model and/or an MLA bundle on a data folder (Dice/HD95/ASD,
                       optional PNG overlays)
    feddg segment      segment unlabeled NIfTI scans, masks written in each scan's own geometry
    feddg make-jobs    regenerate the job folders under jobs/ and the consortium files under provisioning/
    feddg simulate     run a job in NVFlare's simulator with the project's site policy installed
    feddg benchmark    leave-one-site-out sweep of methods x held-out sites x seeds: tables, paired intervals, plots
    feddg install-policy  install the project's site policy into provisioned startup kits
    feddg poc          rehearse a job in a local multi-site POC (prepare, start, submit, wait, download, stop)
    feddg rehearse-network  the same with provisioned kits on separate network stacks (root), with link, server
                       and foreign-kit drills
    feddg resume-job   continue a stopped run as a new job from its last global model and round

Exit status: 0 done; 1 check-data found problems, or evaluate/segment could not process some sites/scans (the
others are done; the failures are listed at the end); 2 an error stopped the command (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from feddg.compute import SITE_PROCESSES_ENV

if TYPE_CHECKING:
    from feddg.benchmark.protocol import Protocol


def _cmd_check_data(args: argparse.Namespace) -> int:
    from feddg.data.check import check_data, format_report

    report = check_data(args.layout, Path(args.root), args.sites or None, args.task)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


def _cmd_synth(args: argparse.Namespace) -> int:
    from feddg.config import SyntheticConfig
    from feddg.data.synthetic import generate
    from feddg.jobs import TASK_DEFAULTS

    # Unset sizes default to what the task's jobs generate, so `feddg synth` writes the same data set.
    given = {k: getattr(args, k) for k in ("seed", "cases_per_site", "slices_per_case", "size", "shift")}
    cfg = SyntheticConfig(**{**TASK_DEFAULTS[args.task]["data"]["synthetic"],
                             **{k: v for k, v in given.items() if v is not None}})
    out = generate(args.task, Path(args.out), cfg, args.sites or None)
    print(f"wrote synthetic {args.task} sites to {out}")
    return 0


def _cmd_make_jobs(args: argparse.Namespace) -> int:
    from feddg.config import parse_overrides
    from feddg.flare.registry import merge
    from feddg.jobs import JOBS, PAPER_SIZE, stale_files, write_job
    from feddg.provisioning import stale_projects, write_projects

    overrides = merge(PAPER_SIZE if args.paper else {}, parse_overrides(args.overrides or []))
    if overrides and (args.out is None or args.check):
        raise ValueError("--set and --paper write jobs that differ from the template: give --out DIR (not the "
                         "committed jobs/) and no --check")
    if args.out is not None:
        output_folder(args.out, "--out", template_jobs=not overrides, reading=args.check)
    args.out = args.out or "jobs"
    provisioning = Path(args.out).parent / "provisioning"
    if args.check:
        stale = stale_files(Path(args.out)) + stale_projects(provisioning)
        for path in stale:
            print(f"out of date: {path}")
        return 1 if stale else 0
    for name in args.names or JOBS:
        print(f"wrote {write_job(Path(args.out), name, overrides or None)}")
    if not args.names and not overrides:
        for path in write_projects(provisioning):
            print(f"wrote {path}")
    return 0


def _cmd_install_policy(args: argparse.Namespace) -> int:
    from feddg.flare.egress_filter import all_site_limits
    from feddg.flare.site_policy import install_site_policy

    limits = {name: getattr(args, name) for name in all_site_limits()}
    for path in install_site_policy(Path(args.kit), args.gpus, args.gpu_mem, limits):
        print(f"wrote {path}")
    return 0


def _cmd_resume_job(args: argparse.Namespace) -> int:
    from feddg.resume import resume_job

    out, start, total = resume_job(Path(args.job), Path(args.previous), Path(args.out), args.rounds)
    print(f"wrote {out}: rounds {start}..{total - 1} of {total}, from the model saved after round {start - 1}")
    return 0


def _cmd_rehearse_network(args: argparse.Namespace) -> int:
    from feddg.rehearsal.command import run

    return run(args)


def _cmd_poc(args: argparse.Namespace) -> int:
    from feddg.poc import main as poc_main

    return poc_main([args.job, "--workspace", args.workspace, "--timeout", str(args.timeout)])


def _cmd_simulate(args: argparse.Namespace, rest: list[str]) -> int:
    """Install the site policy in the simulator workspace, then hand over to ``nvflare simulator``.

    NVFlare 2.9's simulator enforces each site's class allow-list for jobs without custom code, as a real site
    does; a fresh workspace has none, so the job's ``feddg`` components would be refused. The simulator keeps
    ``<workspace>/local`` across runs and copies it to every site, so this is done once per workspace."""
    import os
    import shutil

    from feddg.flare.site_policy import install_resources

    simulator_flags(rest)  # a mistyped flag fails here, naming it, not in NVFlare's log
    if args.overrides:
        from feddg.config import parse_overrides
        from feddg.jobs import override_job

        # Beside the workspace, not in it: the simulator clears its workspace when it starts.
        workspace = Path(args.workspace).resolve()
        job = override_job(Path(args.job), parse_overrides(args.overrides),
                           workspace.with_name(f"{workspace.name}_job") / Path(args.job).resolve().name)
        print(f"wrote {job}: {args.job} with --set {' '.join(args.overrides)}", flush=True)
        args.job = str(job)
    local = Path(args.workspace) / "local"
    install_resources(local)
    configured = configure_simulated_sites(Path(args.job), local)
    if configured is not None:
        path, settings = configured
        print(f"this job asks the sites' own settings {settings}; all simulated sites are yours, so {path} sets "
              f"them", flush=True)
    nvflare = shutil.which("nvflare")
    if nvflare is None:
        raise OSError("the nvflare command is not on PATH; install the requirements first")
    rest, site_processes = simulator_threads(Path(args.job), rest)
    command = [nvflare, "simulator", args.job, "-w", args.workspace, *rest]
    os.environ[SITE_PROCESSES_ENV] = str(site_processes)
    print(f"running: {SITE_PROCESSES_ENV}={site_processes} {' '.join(command)}", flush=True)
    os.execv(nvflare, command)
    return 1  # not reached


def simulator_threads(job: Path, rest: list[str]) -> tuple[list[str], int]:
    """The simulator's arguments with ``-t`` defaulted to the number of sites, and the number of site processes
    that will then run at once on this host (for :mod:`feddg.compute`'s thread budget).

    Every site in its own long-lived process, all at once: NVFlare's default of one thread starts a fresh process
    for every task (about 6 s each on a 2-core machine, 37 of them in the headline job), and with each process
    limited to its share of the cores, running them side by side costs no more CPU than running them in turn.
    The sites come from ``-c``, ``-n`` or the job's ``meta.json`` deploy map. With several GPU groups (``-gpu 0,1``)
    NVFlare runs one client per group at a time, and ``-t`` is left alone."""
    from nvflare.private.fed.utils.fed_utils import split_gpus  # noqa: PLC0415 - nvflare is slow to import

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-n", "--n_clients", type=int)
    parser.add_argument("-c", "--clients")
    parser.add_argument("-t", "--threads", type=int)
    parser.add_argument("-gpu", "--gpu")
    known, _ = parser.parse_known_args(rest)
    if known.gpu and len(split_gpus(known.gpu)) > 1:
        return rest, len(split_gpus(known.gpu))
    if known.clients:
        sites = len([c for c in known.clients.split(",") if c.strip()])
    elif known.n_clients:
        sites = known.n_clients
    else:
        sites = len(deploy_map_sites(job))
    if known.threads is not None:
        return rest, max(1, min(known.threads, sites or known.threads))
    if not sites:
        return rest, 1
    return [*rest, "-t", str(sites)], sites


def deploy_map_sites(job: Path) -> set[str]:
    """The client names of a job's ``meta.json`` deploy map (empty when it names none, e.g. only ``@ALL``)."""
    try:
        meta = json.loads((Path(job) / "meta.json").read_text())
    except (OSError, ValueError):
        return set()
    names = {n for targets in (meta.get("deploy_map") or {}).values() for n in targets}
    return names - {"server", "@ALL"}


COMMITTED_JOBS = Path(__file__).resolve().parents[2] / "jobs"  # the repository's job folders (a source checkout)


def simulator_flags(flags: list[str]) -> list[str]:
    """``flags`` for ``nvflare simulator``, checked against its own options: ValueError naming an unknown flag, a
    bad value, or the workspace (feddg gives it with -w)."""
    from nvflare.private.fed.app.simulator.simulator import define_simulator_parser  # noqa: PLC0415 - slow import

    parser = argparse.ArgumentParser(prog="nvflare simulator", add_help=False, exit_on_error=False)
    define_simulator_parser(parser)
    try:
        known, unknown = parser.parse_known_args(["JOB", *flags])
    except argparse.ArgumentError as e:
        raise ValueError(f"simulator flags {' '.join(flags)}: {e}") from None
    if unknown:
        raise ValueError(f"{' '.join(unknown)}: not a flag of nvflare simulator (its flags: -n, -c, -t, -gpu, -l, -m,"
                         f" --end_run_for_all)")
    if known.workspace is not None:
        raise ValueError(f"simulator flags {' '.join(flags)}: the workspace is feddg's to give (-w before --)")
    return flags


def output_folder(value: str, flag: str, template_jobs: bool = False, reading: bool = False) -> Path:
    """``value`` as the folder a command writes into, made absolute: ValueError naming ``flag`` for an empty value,
    the current folder when it holds anything, and the repository's committed jobs/ or a folder in it (unless
    ``template_jobs``: make-jobs writing the template itself). ``reading`` (a check): only the empty value."""
    if not value.strip():
        raise ValueError(f"{flag} is empty: give a folder")
    path = Path(value).expanduser().resolve()
    if reading:
        return path
    if path == Path.cwd().resolve() and any(path.iterdir()):
        raise ValueError(f"{flag} {value!r} is the current folder, which is not empty: give a new or empty folder")
    jobs = COMMITTED_JOBS.resolve()
    if not template_jobs and (path == jobs or jobs in path.parents):
        raise ValueError(f"{flag} {value!r} is in the repository's committed {jobs}, which only the template "
                         f"writes: give another folder")
    return path


def _names(value: str | None, flag: str) -> list[str] | None:
    """A comma-separated option as its names (None when not given); ValueError naming ``flag`` for an empty value,
    an empty name or a name given twice."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",")]
    if not value.strip() or not all(names):
        raise ValueError(f"{flag} {value!r}: an empty name; give comma-separated names")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{flag} {value!r}: {', '.join(repeated)} given twice")
    return names


def job_component_paths(job: Path) -> set[str]:
    """Every component class the NVFlare configs of the job folder name."""
    from feddg.flare.site_policy import component_paths

    found: set[str] = set()
    for config in Path(job).glob("*/config/config_fed_*.json"):
        try:
            found |= component_paths(json.loads(config.read_text()))
        except (OSError, ValueError):
            continue
    return found


def configure_simulated_sites(job: Path, local_dir: Path) -> tuple[Path, dict] | None:
    """In the simulator every site is the user's own: when the job's methods ask something of a site's own
    ``local/feddg_site.json`` (:func:`feddg.flare.registry.simulated_site_config`; MLA: share the local model), write
    it to ``<workspace>/local/feddg_site.json`` (the simulator copies the workspace's ``local`` folder to every site)
    unless the workspace already has one. Returns (the file written, its settings), or None."""
    from feddg.flare.registry import simulated_site_config
    from feddg.flare.site_config import SITE_CONFIG_FILE

    path = Path(local_dir) / SITE_CONFIG_FILE
    settings = simulated_site_config(job_component_paths(job))
    if path.exists() or not settings:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")
    return path, settings


def _cmd_benchmark(args: argparse.Namespace, simulator_args: list[str]) -> int:
    """The leave-one-site-out sweep (:mod:`feddg.benchmark.sweep`), then its tables, plots and statistics."""
    from feddg.benchmark.results import write_results
    from feddg.benchmark.signals import handle_stop_signals
    from feddg.benchmark.sweep import sweep
    from feddg.flare.registry import methods

    with handle_stop_signals():  # Ctrl-C / SIGTERM: one line and exit status 130 / 143 (see main)
        out, protocol, chosen, held_out, seeds, sites = _sweep_options(args, simulator_args)

        def tables() -> dict:
            return write_results(out, list(methods()), sites, args.resamples)

        records = sweep(out, protocol, chosen, held_out, seeds, args.run_timeout, args.retry_failed,
                        reproduce_check=args.reproduce_check, dry_run=args.dry_run,
                        move_aside=args.move_aside_mismatched, after_run=tables)
        if args.dry_run:
            return 0
        paths = tables()
    print((out / "results.md").read_text())
    print("wrote " + ", ".join(str(p) for p in (paths["csv"], paths["markdown"], paths["json"], *paths["plots"])))
    failed = [r["run_id"] for r in records if r["status"] != "ok"]
    if failed:
        print(f"{len(failed)} run(s) did not finish: {', '.join(failed)} (see their run.json)", file=sys.stderr)
    return 1 if failed else 0


def _sweep_options(args: argparse.Namespace, simulator_args: list[str]
                   ) -> tuple[Path, Protocol, list[str], list[str], list[int], list[str]]:
    """(out, protocol, methods, held-out sites, seeds, the task's sites) from the benchmark options, every option
    checked before anything is planned or run: ValueError naming the option otherwise."""
    from feddg.benchmark.sweep import Protocol, default_overrides, parse_seeds
    from feddg.config import parse_overrides
    from feddg.flare.registry import merge, methods
    from feddg.jobs import TASK_DEFAULTS

    out = output_folder(args.out, "--out")
    seeds = parse_seeds(args.seeds)
    if args.resamples < 1:
        raise ValueError(f"--resamples {args.resamples}: give a positive number of resamples")
    if not args.run_timeout > 0:
        raise ValueError(f"--run-timeout {args.run_timeout:g}: give a positive number of seconds")
    if args.data_root is not None and not args.data_root.strip():
        raise ValueError("--data-root is empty: give the folder holding one sub-folder per site, or leave the "
                         "option out for the synthetic data")
    if args.layout and args.data_root is None:
        raise ValueError(f"--layout {args.layout} needs --data-root: the layout of which data?")
    assignments = list(args.overrides or [])
    if args.data_root:
        assignments.append(f"data.root={Path(args.data_root).expanduser().resolve()}")
    if args.layout:
        assignments.append(f"data.layout={args.layout}")
    overrides = merge(default_overrides(args.task, synthetic=not args.data_root), parse_overrides(assignments))
    root = overrides.get("data", {}).get("root")
    if isinstance(root, str) and root.strip():  # --set data.root=relative: resolved here too, as runs need
        overrides["data"]["root"] = str(Path(root).expanduser().resolve())
    protocol = Protocol(args.task, overrides, simulator_flags(simulator_args))
    task_methods = [m for m, spec in methods().items() if spec.supports(args.task)]
    chosen = _names(args.methods, "--methods") or task_methods
    unknown = [m for m in chosen if m not in methods()]
    if unknown:
        raise ValueError(f"--methods {unknown}: unknown method(s); the methods are {list(methods())}")
    unsupported = [m for m in chosen if m not in task_methods]
    if unsupported:
        raise ValueError(f"--methods {unsupported}: no {args.task} job for these methods")
    sites = merge(TASK_DEFAULTS[args.task]["data"], overrides.get("data", {}))["sites"]
    held_out = sites if args.held_out == "all" else _names(args.held_out, "--held-out") or sites
    unknown = sorted(set(held_out) - set(sites))
    if unknown:
        raise ValueError(f"--held-out {unknown}: not among the task's sites {sites}")
    return out, protocol, chosen, held_out, seeds, sites


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from feddg.inference import evaluate_folder

    if args.model is None and args.bundle is None:
        raise ValueError("give --model (a saved global model), --bundle (an MLA bundle folder) or both")
    return evaluate_folder(
        model_path=Path(args.model) if args.model else None, data_root=Path(args.data_root), sites=args.sites,
        layout=args.layout, overlays_dir=Path(args.overlays) if args.overlays else None,
        json_path=Path(args.json) if args.json else None, largest_component=args.largest_component,
        bundle_path=Path(args.bundle) if args.bundle else None,
    )


def _cmd_segment(args: argparse.Namespace) -> int:
    from feddg.inference import segment_scans

    return segment_scans(model_path=Path(args.model), inputs=[Path(p) for p in args.inputs], out_dir=Path(args.out),
                         largest_component=args.largest_component, overwrite=args.overwrite)


def build_parser() -> argparse.ArgumentParser:
    from typing import get_args

    from feddg.config import SyntheticConfig
    from feddg.flare.egress_filter import all_site_limits

    parser = argparse.ArgumentParser(prog="feddg", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check-data", help="check a data folder before joining a federation (changes nothing)")
    p.add_argument("--layout", required=True, choices=["saml_nifti", "slice_png", "dofe_png"])
    p.add_argument("--root", required=True, help="folder holding one sub-folder per site")
    p.add_argument("--sites", nargs="*", help="site folders to check (default: all)")
    p.add_argument("--task", choices=["prostate", "fundus"], help="default: from the layout")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.set_defaults(func=_cmd_check_data)

    p = sub.add_parser("synth", help="write the synthetic multi-site data set")
    p.add_argument("--task", required=True, choices=["prostate", "fundus"])
    p.add_argument("--out", required=True)
    p.add_argument("--sites", nargs="*")
    p.add_argument("--seed", type=int, help="default: the jobs' seed")
    p.add_argument("--cases-per-site", type=int, help="default: as the task's jobs")
    p.add_argument("--slices-per-case", type=int, help="default: as the task's jobs (prostate)")
    p.add_argument("--size", type=int, help="in-plane size in px; default: as the task's jobs")
    p.add_argument("--shift", choices=list(get_args(SyntheticConfig.model_fields["shift"].annotation)),
                   help="how the sites differ: style_and_content (acquisition style plus each site's anatomy and "
                        "labelling convention) or style_only (style alone, the same anatomy and labelling everywhere);"
                        " default: as the task's jobs (style_and_content)")
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("evaluate", help="score a saved global model and/or an MLA bundle on a data folder")
    p.add_argument("--model", help="a checkpoint saved by a job (FL_global_model.pt or best_...)")
    p.add_argument("--bundle", help="an MLA bundle folder (mla_bundle/ in an MLA job's server run folder): the "
                                    "attention-combined model is scored next to --model")
    p.add_argument("--data-root", required=True, help="folder with one sub-folder per site, in the model's layout")
    p.add_argument("--sites", nargs="+", required=True, help="site folder(s) to evaluate, each as an unseen site")
    p.add_argument("--layout", help="default: the layout the model was trained on")
    p.add_argument("--overlays", help="write PNG overlays of prediction (red) vs ground truth (green) here")
    p.add_argument("--json", help="write the metrics as JSON to this file")
    p.add_argument("--largest-component", action="store_true", help="keep the largest connected component")
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("segment", help="segment unlabeled NIfTI scans")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="folder for the masks (<scan>_mask.nii.gz)")
    p.add_argument("--largest-component", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace masks that exist already in --out")
    p.add_argument("inputs", nargs="+", help="NIfTI files or folders of them (SAML label files in them are skipped)")
    p.set_defaults(func=_cmd_segment)

    p = sub.add_parser("simulate", help="run a job in the NVFlare simulator (extra flags go to nvflare simulator)")
    p.add_argument("job", help="a job folder, e.g. jobs/prostate_fedavg")
    p.add_argument("-w", "--workspace", required=True, help="simulator workspace folder")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="change a feddg.yaml setting for this run (repeatable), e.g. --set data.unseen_site=BMC; "
                        "the job is copied to <workspace>_job/ with the change")
    p.set_defaults(func=_cmd_simulate, passthrough="simulator")

    p = sub.add_parser("benchmark", help="leave-one-site-out sweep: methods x held-out sites x seeds, each a "
                                         "simulator run, then tables, paired intervals and plots (extra flags after "
                                         "-- go to nvflare simulator)")
    p.add_argument("--task", required=True, choices=["prostate", "fundus"])
    p.add_argument("--out", required=True, help="results folder (created; an existing one is resumed)")
    p.add_argument("--methods", help="comma-separated methods (default: every method of the task)")
    p.add_argument("--held-out", help="comma-separated held-out sites, or all (default)")
    p.add_argument("--seeds", default="0-4", help="training seeds, e.g. 0,1,2 or 0-4 (default: 0-4); seeds are the "
                                                  "unit of the comparisons, so use 3 or more")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="a feddg.yaml setting of every run (repeatable), on top of the sweep's protocol for the "
                        "task (many rounds of one local epoch, chosen by the rounds pilot)")
    p.add_argument("--data-root", help="real data: a folder with one sub-folder per site")
    p.add_argument("--layout", choices=["saml_nifti", "slice_png", "dofe_png"], help="with --data-root")
    p.add_argument("--run-timeout", type=float, default=3600, help="seconds a run may take (default: 3600)")
    p.add_argument("--retry-failed", action="store_true", help="run failed or timed-out runs again")
    p.add_argument("--resamples", type=int, default=9999, help="bootstrap resamples (default: 9999)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated machine time; run nothing")
    p.add_argument("--reproduce-check", action="store_true",
                   help="when the folder's runs were made by other code: re-run one of its cells with this code "
                        "first and add runs only if every per-case score is identical")
    p.add_argument("--move-aside-mismatched", action="store_true",
                   help="move the folder's runs whose config is not this protocol's to OUT/aside/ (default: refuse "
                        "the folder, naming the first such run and setting)")
    p.set_defaults(func=_cmd_benchmark, passthrough="after --")

    p = sub.add_parser("make-jobs", help="regenerate the job folders from the template")
    p.add_argument("--out", help="folder for the jobs (default: jobs)")
    p.add_argument("--check", action="store_true", help="only report job files that differ from the template")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="change a feddg.yaml setting of every job written (repeatable; only with --out)")
    p.add_argument("--paper", action="store_true", help="the papers' setting (384 px, 100 rounds, batch 5), for GPUs")
    p.add_argument("names", nargs="*")
    p.set_defaults(func=_cmd_make_jobs)

    p = sub.add_parser("install-policy", help="install the site policy (privacy, authorization, resources) into "
                                              "a startup kit or a provisioned prod_NN folder")
    p.add_argument("kit", help="one server/client kit, or the prod_NN folder of `nvflare provision`")
    p.add_argument("--gpus", type=int, help="GPUs of this site (default: detected on this machine)")
    p.add_argument("--gpu-mem", type=int, help="GiB per GPU (default: detected)")
    for name, limit in all_site_limits().items():  # the site's egress limits: the shared one and each method's
        p.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name, help=limit.help)
    p.set_defaults(func=_cmd_install_policy)

    p = sub.add_parser("poc", help="rehearse a job in a local multi-site POC with the consortium's kits and policy")
    p.add_argument("job", help="a job folder, e.g. jobs/prostate_fedavg")
    p.add_argument("--workspace", default="/tmp/feddg/poc", help="POC folder (deleted and recreated)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job")
    p.set_defaults(func=_cmd_poc)

    from feddg.rehearsal.command import add_arguments as rehearsal_arguments

    p = sub.add_parser("rehearse-network", help="rehearse a job with provisioned kits on separate network stacks "
                                                "(namespaces, root), with link, restart and foreign-kit drills")
    rehearsal_arguments(p)
    p.set_defaults(func=_cmd_rehearse_network)

    p = sub.add_parser("resume-job", help="continue a stopped run as a new job (start round + last global model)")
    p.add_argument("job", help="the job folder the previous run was submitted from")
    p.add_argument("--from", dest="previous", required=True,
                   help="the previous run's result (nvflare job download folder or server run folder)")
    p.add_argument("--out", required=True, help="folder for the resumed job (must not exist)")
    p.add_argument("--rounds", type=int, help="total rounds of the whole training (default: the job's)")
    p.set_defaults(func=_cmd_resume_job)
    return parser


def main(argv: list[str] | None = None) -> int:
    from feddg.benchmark.signals import Interrupted

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    mode = getattr(args, "passthrough", None)
    before, after = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    if (before and mode != "simulator") or (after and not mode):  # only what follows -- reaches the simulator
        hint = " (flags for nvflare simulator go after --)" if mode else ""
        parser.error(f"unrecognized arguments: {' '.join(before or after)}{hint}")
    try:
        return args.func(args, before + after) if mode else args.func(args)
    except (ValueError, OSError) as e:  # DataError and ConfigError are ValueErrors with a message that names things
        print(f"feddg {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"feddg {args.command}: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
