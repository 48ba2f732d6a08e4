"""Run a job's recipe on the simulator, a local POC or the consortium's deployment, or export it.

    python -m feddg.recipes JOB [--set KEY=VALUE ...] [--env sim] [-w ROOT] [--threads N] [--gpu 0,1]
    python -m feddg.recipes JOB [--set KEY=VALUE ...] --env poc [--workspace W] [--timeout S]
    python -m feddg.recipes JOB [--set KEY=VALUE ...] --env prod --kit ADMIN_KIT [--timeout S]
    python -m feddg.recipes JOB [--set KEY=VALUE ...] --export [--export-dir D]      (writes D/JOB)

``python job.py ...`` at the repository root is the same command. JOB is ``<task>_<method>`` (``prostate_ga``);
every registered method has one per data task it supports. After a run it prints the leave-one-site-out table and
the report's path: sim: ``ROOT/JOB/server/simulate_job/feddg_report.json``; poc and prod: in the downloaded result.

Exit status, as ``feddg``: 0 done; 1 the job ran and failed (or left no report); 2 an error stopped the command
before the job was built or submitted (one line on stderr: an invalid experiment or ``--set`` key, an unknown job,
a missing or wrong kit, a server that does not answer); 130 / 143 interrupted (every process started is stopped).
``--export`` and ``--export-dir`` are NVFlare's own: importing ``nvflare.recipe`` takes them out of ``sys.argv``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from nvflare.recipe.sim_env import SIMULATOR_WORKSPACE_ROOT_ENV_VAR, WORKSPACE_ROOT
from nvflare.recipe.spec import ExecEnv

from feddg.folders import SIMULATOR_KEEPS, guard_folder
from feddg.numbers import seconds
from feddg.recipes.recipe import FedDGRecipe, job_names, split_job

PROG = "python -m feddg.recipes"
ENVS = ("sim", "poc", "prod")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("job", metavar="JOB", help=f"<task>_<method>, one of: {', '.join(job_names())}")
    parser.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                        help="change a feddg.yaml setting (repeatable), e.g. --set train.rounds=2")
    parser.add_argument("--env", choices=ENVS, default="sim",
                        help="sim: NVFlare's simulator (default); poc: a local POC of the job's sites; prod: the "
                             "deployment of --kit")
    sim = parser.add_argument_group("--env sim")
    sim.add_argument("-w", "--workspace-root", help=f"the run is ROOT/JOB (default: {WORKSPACE_ROOT}; "
                                                    f"NVFLARE_SIMULATOR_WORKSPACE_ROOT wins when set)")
    sim.add_argument("--threads", type=int, help="site processes at once (default: one per site)")
    sim.add_argument("--gpu", help="GPU groups of the simulated sites, e.g. 0,1")
    poc = parser.add_argument_group("--env poc")
    poc.add_argument("--workspace", help="the POC's folder, deleted and recreated (default: /tmp/feddg/poc)")
    prod = parser.add_argument_group("--env prod")
    prod.add_argument("--kit", help="a hospital lead's admin startup kit of the deployment")
    parser.add_argument("--timeout", type=seconds, default=3600,
                        help="poc, prod: seconds to wait for the job (default: 3600)")
    return parser


def _check_options(args: argparse.Namespace) -> None:
    """ValueError naming an option given for another environment, or a missing one."""
    given = {"-w": args.workspace_root, "--threads": args.threads, "--gpu": args.gpu, "--workspace": args.workspace,
             "--kit": args.kit}
    owner = {"-w": "sim", "--threads": "sim", "--gpu": "sim", "--workspace": "poc", "--kit": "prod"}
    wrong = [flag for flag, value in given.items() if value is not None and owner[flag] != args.env]
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: not an option of --env {args.env} "
                         f"({', '.join(f'{f} is for --env {owner[f]}' for f in wrong)})")
    if args.env == "prod" and not args.kit:
        raise ValueError("--env prod needs --kit ADMIN_KIT: a hospital lead's admin startup kit of the deployment")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: give 1 or more")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):  # nan fails both; every wait is bounded
        raise ValueError(f"--timeout {args.timeout:g}: give a positive, finite number of seconds")
    for flag, value in (("-w", args.workspace_root), ("--workspace", args.workspace), ("--kit", args.kit)):
        if value is not None and not value.strip():
            raise ValueError(f"{flag} is empty: give a folder")


def check_folders(args: argparse.Namespace) -> None:
    """Every folder this run creates, clears or replaces, checked before anything is built
    (:func:`feddg.folders.guard_folder`): with NVFlare's ``--export``, ``--export-dir`` (NVFlare replaces only a
    folder of the same job in it); else the simulator's run folder ``ROOT/JOB`` of ``-w``, which NVFlare's simulator
    clears, or the POC's ``--workspace``, which is deleted and recreated."""
    from nvflare.recipe.spec import _peek_recipe_args  # the export flags NVFlare took out of sys.argv at import

    export, export_dir = _peek_recipe_args()
    if export:
        guard_folder(export_dir, "--export-dir", whole=False)
    elif args.env == "sim":
        from_env = os.environ.get(SIMULATOR_WORKSPACE_ROOT_ENV_VAR)  # wins over -w, as in SimEnv
        given = from_env or args.workspace_root or WORKSPACE_ROOT
        option = SIMULATOR_WORKSPACE_ROOT_ENV_VAR if from_env else "-w"
        guard_folder(given, option, whole=False)  # where the run's folder goes
        guard_folder(Path(given).expanduser() / args.job, f"{option} {given} (its run folder ROOT/{args.job})",
                     keeps=SIMULATOR_KEEPS)
    elif args.env == "poc":
        from feddg.recipes.poc import DEFAULT_WORKSPACE

        guard_folder(args.workspace or DEFAULT_WORKSPACE, "--workspace")


def make_env(args: argparse.Namespace, sites: list[str]) -> ExecEnv:
    """The environment ``--env`` names, its own checks done (prod: the kit and the server, before anything is
    built)."""
    if args.env == "sim":
        from feddg.recipes.sim import FedDGSimEnv

        root = Path(args.workspace_root or WORKSPACE_ROOT).expanduser().resolve()
        return FedDGSimEnv(clients=sites, workspace_root=root, num_threads=args.threads, gpu_config=args.gpu)
    if args.env == "poc":
        from feddg.recipes.poc import DEFAULT_WORKSPACE, FedDGPocEnv

        return FedDGPocEnv(args.workspace or DEFAULT_WORKSPACE, args.timeout)
    from feddg.recipes.prod import prod_env

    return prod_env(Path(args.kit))


def run(args: argparse.Namespace) -> int:
    """Build the recipe and run it (or export it, with NVFlare's ``--export``); the exit status."""
    from feddg.experiment import experiment_from_dict, parse_overrides
    from feddg.jobs import experiment

    _check_options(args)
    check_folders(args)
    overrides = parse_overrides(args.overrides or [])
    task, method = split_job(args.job)
    sites = list(experiment_from_dict(experiment(task, method, overrides)).data.sites)  # refused before building
    env = make_env(args, sites)
    try:
        recipe = FedDGRecipe(task, method, overrides)
        job_id = recipe.execute(env).get_job_id()  # with --export: writes the job and exits 0
        report_path = _report(args, env, recipe, job_id)
    finally:
        env.stop()
    if report_path is None:
        return 1
    report = json.loads(report_path.read_text())
    from feddg.report import format_table

    print(f"\n{recipe.name} on --env {args.env}, unseen site {report['unseen_site']} (report: {report_path})\n"
          f"{format_table(report['table'])}\n", flush=True)
    return 0


def _report(args: argparse.Namespace, env: ExecEnv, recipe: FedDGRecipe, job_id: str) -> Path | None:
    """The job's report once it has ended (None, with a line on stderr, when it left none)."""
    from feddg.report import REPORT_FILE

    if args.env == "sim":
        path = env.report_path(recipe.name)  # type: ignore[attr-defined]
        found = [path] if path.exists() else []
        where = path.parent
    else:
        result = env.get_job_result(job_id, timeout=args.timeout)
        if result is None:
            print(f"{PROG}: job {job_id} did not finish within {args.timeout:.0f} s (status: "
                  f"{env.get_job_status(job_id)})", file=sys.stderr)
            return None
        where = Path(result)
        found = sorted(where.rglob(REPORT_FILE))
    if not found:
        print(f"{PROG}: job {job_id} wrote no {REPORT_FILE} under {where} (status: {env.get_job_status(job_id)})",
              file=sys.stderr)
        return None
    return found[0]


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    from feddg.benchmark.signals import Interrupted, handle_stop_signals

    args = build_parser(prog).parse_args(argv)
    try:
        with handle_stop_signals():  # Ctrl-C / SIGTERM: every process started is stopped, exit 130 / 143
            return run(args)
    except (ValueError, OSError) as e:  # ConfigError, unknown job or method, a refused kit: one line
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job ran and failed (simulator exit status, POC status, submission)
        print(f"{prog}: the job failed: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"{prog}: interrupted by signal {e.signum}; every process it started is stopped", file=sys.stderr)
        return e.exit_code
