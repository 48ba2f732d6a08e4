"""The ``feddg`` command: tools for hospitals and researchers around the federated jobs.

    feddg check-data   check a site's data folder before joining (read-only)
    feddg synth        write the synthetic multi-site data set to a folder
    feddg evaluate     score a saved global model and/or an MLA bundle on a data folder (Dice/HD95/ASD,
                       optional PNG overlays)
    feddg segment      segment unlabeled NIfTI scans, masks written in each scan's own geometry
    feddg make-jobs    write the job folders under jobs/ (the NVFlare Recipes' exports, feddg.recipes) and the
                       consortium files under provisioning/
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

from feddg.folders import claim, guard_folder
from feddg.numbers import seconds

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
    from feddg.experiment import TASK_DEFAULTS

    # Unset sizes default to what the task's jobs generate, so `feddg synth` writes the same data set.
    given = {k: getattr(args, k) for k in ("seed", "cases_per_site", "slices_per_case", "size", "shift")}
    cfg = SyntheticConfig(**{**TASK_DEFAULTS[args.task]["data"]["synthetic"],
                             **{k: v for k, v in given.items() if v is not None}})
    out = generate(args.task, claim(guard_folder(args.out, "--out"), "feddg synth"), cfg, args.sites or None)
    print(f"wrote synthetic {args.task} sites to {out}")
    return 0


def _cmd_make_jobs(args: argparse.Namespace) -> int:
    from feddg.experiment import PAPER_SIZE, merge, parse_overrides
    from feddg.jobs import JOBS
    from feddg.provisioning import stale_projects, write_projects

    overrides = merge(PAPER_SIZE if args.paper else {}, parse_overrides(args.overrides or []))
    if overrides and (args.out is None or args.check):
        raise ValueError("--set and --paper write jobs that differ from the template: give --out DIR (not the "
                         "committed jobs/) and no --check")
    if args.out is not None and args.check and not args.out.strip():
        raise ValueError("--out is empty: give the folder of the jobs to check")
    if args.out is not None and not args.check:  # adds one folder per job (NVFlare replaces only a folder of that job)
        guard_folder(args.out, "--out", whole=False, template_jobs=not overrides)
    args.out = args.out or "jobs"
    provisioning = Path(args.out).parent / "provisioning"
    if not args.check and not args.names and not overrides and args.out != "jobs":
        guard_folder(provisioning, "--out (its ../provisioning)", whole=False)
    if args.check:
        from feddg.recipes.export import stale_jobs

        stale = stale_jobs(Path(args.out)) + stale_projects(provisioning)
        for path in stale:
            print(f"out of date: {path}")
        return 1 if stale else 0
    from feddg.recipes.export import write_job

    for name in args.names or JOBS:
        print(f"wrote {write_job(Path(args.out), name, overrides or None)}")
    if not args.names and not overrides:
        for path in write_projects(provisioning):
            print(f"wrote {path}")
    return 0


def _cmd_install_policy(args: argparse.Namespace) -> int:
    from feddg.flare.site_limits import all_site_limits
    from feddg.flare.site_policy import install_site_policy

    limits = {name: getattr(args, name) for name in all_site_limits()}
    for path in install_site_policy(Path(args.kit), args.gpus, args.gpu_mem, limits):
        print(f"wrote {path}")
    return 0


def _cmd_resume_job(args: argparse.Namespace) -> int:
    from feddg.resume import resume_job

    out = guard_folder(args.out, "--out", inputs=[args.job, args.previous])
    out, start, total = resume_job(Path(args.job), Path(args.previous), out, args.rounds)
    print(f"wrote {out}: rounds {start}..{total - 1} of {total}, from the model saved after round {start - 1}")
    return 0


def _cmd_rehearse_network(args: argparse.Namespace) -> int:
    from feddg.rehearsal.command import run

    return run(args)


def _cmd_poc(args: argparse.Namespace) -> int:
    from feddg.poc import main as poc_main

    return poc_main([args.job, "--workspace", args.workspace, "--timeout", str(args.timeout)])


def _cmd_simulate(args: argparse.Namespace, rest: list[str]) -> int:
    from feddg.simulate import run

    return run(args.job, args.workspace, args.overrides, rest)


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


def _cmd_benchmark(args: argparse.Namespace, simulator_args: list[str]) -> int:
    """The leave-one-site-out sweep (:mod:`feddg.benchmark.sweep`), then its tables, plots and statistics."""
    from feddg.benchmark.executors import executor_from_args
    from feddg.benchmark.results import write_results
    from feddg.benchmark.signals import handle_stop_signals
    from feddg.benchmark.sweep import sweep
    from feddg.flare.registry import methods

    with handle_stop_signals():  # Ctrl-C / SIGTERM: one line and exit status 130 / 143 (see main)
        out, protocol, chosen, held_out, seeds, sites = _sweep_options(args, simulator_args)
        executor = executor_from_args(args)  # its own options checked (ExecutorError, a ValueError: one line)

        if args.tables_only:  # nothing runs: the folder's tables as this code writes them, its sites in its order
            sites = _tables_only_sites(args, out)

        def tables() -> dict:
            return write_results(out, list(methods()), sites, args.resamples)

        if args.tables_only:
            # Without the folder's lock: its use is beside a sweep of older code, which holds the lock for its whole
            # length and rewrites the tables only when one of its runs ends; both write from the same run records.
            records = []
        else:
            records = sweep(out, protocol, chosen, held_out, seeds, args.run_timeout, args.retry_failed,
                            reproduce_check=args.reproduce_check, dry_run=args.dry_run,
                            move_aside=args.move_aside_mismatched, after_run=tables, executor=executor,
                            cpu_pin=args.cpu_pin)
            if args.dry_run:
                return 0
        paths = tables()
    print((out / "results.md").read_text())
    print("wrote " + ", ".join(str(p) for p in (paths["csv"], paths["markdown"], paths["json"], *paths["plots"])))
    failed = [r["run_id"] for r in records if r["status"] != "ok"]
    if failed:
        print(f"{len(failed)} run(s) did not finish: {', '.join(failed)} (see their run.json)", file=sys.stderr)
    return 1 if failed else 0


def _tables_only_sites(args: argparse.Namespace, out: Path) -> list[str]:
    """The sites of ``--tables-only``'s tables (:func:`~feddg.benchmark.results.folder_sites`), after refusing an
    option that would run something or choose cells (the tables cover every run of the folder)."""
    from feddg.benchmark.results import folder_sites

    given = [f"--{name.replace('_', '-')}" for name in ("dry_run", "reproduce_check", "retry_failed",
                                                          "move_aside_mismatched", "methods", "held_out")
             if getattr(args, name)]
    if given:
        raise ValueError(f"--tables-only runs nothing and writes the tables of every run of the folder: leave out "
                         f"{', '.join(given)}")
    try:
        return folder_sites(out, args.task)
    except ValueError as e:
        raise ValueError(f"--tables-only: {e}") from None


def _sweep_options(args: argparse.Namespace, simulator_args: list[str]
                   ) -> tuple[Path, Protocol, list[str], list[str], list[int], list[str]]:
    """(out, protocol, methods, held-out sites, seeds, the task's sites) from the benchmark options, every option
    checked before anything is planned or run: ValueError naming the option otherwise."""
    from feddg.benchmark.sweep import Protocol, default_overrides, parse_seeds
    from feddg.experiment import merge, parse_overrides, task_sites
    from feddg.flare.registry import methods

    inputs = [args.data_root] if args.data_root and args.data_root.strip() else []
    out = guard_folder(args.out, "--out", inputs=inputs)
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
    from feddg.simulate import simulator_flags

    protocol = Protocol(args.task, overrides, simulator_flags(simulator_args))
    task_methods = [m for m, spec in methods().items() if spec.supports(args.task)]
    chosen = _names(args.methods, "--methods") or task_methods
    unknown = [m for m in chosen if m not in methods()]
    if unknown:
        raise ValueError(f"--methods {unknown}: unknown method(s); the methods are {list(methods())}")
    unsupported = [m for m in chosen if m not in task_methods]
    if unsupported:
        raise ValueError(f"--methods {unsupported}: no {args.task} job for these methods")
    sites = task_sites(args.task, overrides)
    held_out = sites if args.held_out == "all" else _names(args.held_out, "--held-out") or sites
    unknown = sorted(set(held_out) - set(sites))
    if unknown:
        raise ValueError(f"--held-out {unknown}: not among the task's sites {sites}")
    return out, protocol, chosen, held_out, seeds, sites


def _saved_dest(name: str) -> str:
    """The argparse destination of the ``feddg evaluate`` option of the saved model ``name``."""
    return f"saved_model_{name}"


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from feddg.inference import evaluate_folder

    from feddg.flare.registry import saved_models

    saved = {m.name: Path(getattr(args, _saved_dest(m.name))) for m in saved_models()
             if getattr(args, _saved_dest(m.name)) is not None}
    overlays = None
    if args.overlays is not None:  # PNGs replaced by name: a folder of its own
        # checked now, made (and marked ours) only when the first overlay is written: a refusal writes nothing
        overlays = guard_folder(args.overlays, "--overlays", inputs=[
            args.data_root, *([args.model] if args.model else []), *saved.values()])
    return evaluate_folder(
        model_path=Path(args.model) if args.model else None, data_root=Path(args.data_root), sites=args.sites,
        layout=args.layout, overlays_dir=overlays,
        json_path=Path(args.json) if args.json else None, largest_component=args.largest_component,
        saved_models=saved,
    )


def _cmd_segment(args: argparse.Namespace) -> int:
    from feddg.inference import segment_scans

    # Masks are added by name, each refused if it exists unless --overwrite: the folder's location is checked here.
    out = guard_folder(args.out, "--out", whole=False)
    return segment_scans(model_path=Path(args.model), inputs=[Path(p) for p in args.inputs], out_dir=out,
                         largest_component=args.largest_component, overwrite=args.overwrite)


def build_parser() -> argparse.ArgumentParser:
    from typing import get_args

    from feddg.config import TASKS, SyntheticConfig
    from feddg.flare.registry import saved_models
    from feddg.flare.site_limits import all_site_limits
    from feddg.layouts import LAYOUTS, files_help
    from feddg.rehearsal.options import add_arguments as rehearsal_arguments

    parser = argparse.ArgumentParser(prog="feddg", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check-data", help="check a data folder before joining a federation (changes nothing)")
    p.add_argument("--layout", required=True, choices=list(LAYOUTS),
                   help=f"how the folder is organised: {files_help()}")
    p.add_argument("--root", required=True, help="folder holding one sub-folder per site")
    p.add_argument("--sites", nargs="*", help="site folders to check (default: all)")
    p.add_argument("--task", choices=list(TASKS), help="default: from the layout")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.set_defaults(func=_cmd_check_data)

    p = sub.add_parser("synth", help="write the synthetic multi-site data set")
    p.add_argument("--task", required=True, choices=list(TASKS))
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

    p = sub.add_parser("evaluate", help="score a saved global model and/or the models a method saves beside it "
                                        "(MLA's bundle) on a data folder")
    p.add_argument("--model", help="a checkpoint saved by a job (FL_global_model.pt or best_...)")
    for saved in saved_models():  # each method's saved model (MLA: --bundle), declared by its part
        p.add_argument(saved.option, dest=_saved_dest(saved.name), help=saved.help)
    p.add_argument("--data-root", required=True, help="folder with one sub-folder per site, in the model's layout")
    p.add_argument("--sites", nargs="+", required=True, help="site folder(s) to evaluate, each as an unseen site")
    p.add_argument("--layout", choices=list(LAYOUTS), help="default: the layout the model was trained on")
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
    p.add_argument("--task", required=True, choices=list(TASKS))
    p.add_argument("--out", required=True, help="results folder (created; an existing one is resumed)")
    p.add_argument("--methods", help="comma-separated methods (default: every method of the task)")
    p.add_argument("--held-out", help="comma-separated held-out sites, or all (default)")
    p.add_argument("--seeds", default="0-4", help="training seeds, e.g. 0,1,2 or 0-4 (default: 0-4); seeds are the "
                                                  "unit of the comparisons, so use 3 or more")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="a feddg.yaml setting of every run (repeatable), on top of the sweep's protocol for the "
                        "task (many rounds of one local epoch, chosen by the rounds pilot)")
    p.add_argument("--data-root", help="real data: a folder with one sub-folder per site")
    p.add_argument("--layout", choices=list(LAYOUTS), help="with --data-root")
    p.add_argument("--run-timeout", type=seconds, default=3600, help="seconds a run may take (default: 3600)")
    p.add_argument("--retry-failed", action="store_true", help="run failed or timed-out runs again")
    p.add_argument("--resamples", type=int, default=9999, help="bootstrap resamples (default: 9999)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated machine time; run nothing")
    p.add_argument("--tables-only", action="store_true",
                   help="rewrite the folder's tables, plots and results.json from every run in it with this code; "
                        "run nothing (after runs made by another code version's sweep, which writes its own format)")
    p.add_argument("--reproduce-check", action="store_true",
                   help="when the folder's runs were made by other code: re-run one of its cells with this code "
                        "first and add runs only if every per-case score is identical")
    p.add_argument("--cpu-pin", choices=["off", "avx2"], default="off",
                   help="the runs' CPU numerics: off (default) lets PyTorch, oneDNN and MKL take the machine's fastest "
                        "kernels; avx2 caps them at AVX2. A run repeats only on its CPU family (maker and kernels), "
                        "so each seed's runs are kept within one (feddg.numerics)")
    p.add_argument("--move-aside-mismatched", action="store_true",
                   help="move the folder's runs whose config is not this protocol's to OUT/aside/ (default: refuse "
                        "the folder, naming the first such run and setting)")
    from feddg.benchmark.executors import add_executor_arguments

    add_executor_arguments(p)  # --executor and each executor's own options (feddg.benchmark.executors)
    p.set_defaults(func=_cmd_benchmark, passthrough="after --")

    p = sub.add_parser("make-jobs", help="write the job folders as their recipes' exports (feddg.recipes)")
    p.add_argument("--out", help="folder for the jobs (default: jobs)")
    p.add_argument("--check", action="store_true",
                   help="only report job files that differ from the recipes' exports (changed, missing, extra)")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="change a feddg.yaml setting of every job written (repeatable; only with --out)")
    p.add_argument("--paper", action="store_true",
                   help="the papers' size, as ELCFS gives it (384 px, 100 rounds, batch 5), for GPUs")
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
    p.add_argument("--timeout", type=seconds, default=3600, help="seconds to wait for the job")
    p.set_defaults(func=_cmd_poc)

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
