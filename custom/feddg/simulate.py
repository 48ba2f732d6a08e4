"""``feddg simulate``: a job in NVFlare's simulator with the sites' allow-list of this project's classes installed
(NVFlare's simulator enforces no privacy scope, so a site's egress filter is tried in a POC), every site in its own
long-lived process with its share of the cores, and the sites' own settings a job's methods ask for written for the
simulated sites (which are all the user's own)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from feddg.compute import SITE_PROCESSES_ENV, concurrent_runs_from_env
from feddg.folders import SIMULATOR_KEEPS, claim, guard_folder
from feddg.numerics import cpu_pin_mode, pinned_environment

# NVFlare 2.9's simulator runner, what ``nvflare simulator`` and the Recipe API's SimEnv run, with the same flags, and
# with the race that can give two site processes one site's name closed (:mod:`feddg.flare.simulator`). Started as
# a module, its output carries no notice of the deprecated ``nvflare simulator`` command (nvflare/cli.py prints it).
SIMULATOR_MODULE = "feddg.flare.simulator"


def simulator_command(job: str | Path, workspace: str | Path, flags: list[str]) -> list[str]:
    """The command that runs ``job`` in the simulator (:data:`SIMULATOR_MODULE`) in ``workspace`` with the simulator's
    ``flags`` (``-t``, ``-c``, ``-gpu`` ...): what ``feddg simulate``, the recipes' ``--env sim`` and the benchmark's
    NVFlare anchors start."""
    import sys

    return [sys.executable, "-m", SIMULATOR_MODULE, str(job), "-w", str(workspace), *flags]


def run(job: str, workspace: str, overrides: list[str], rest: list[str]) -> int:
    """Install the sites' allow-list in the simulator workspace, then hand over to NVFlare's simulator.

    NVFlare 2.9's simulator enforces each site's class allow-list for jobs without custom code, as a real site
    does; a fresh workspace has none, so the job's ``feddg`` components would be refused. The simulator keeps
    ``<workspace>/local`` across runs and copies it to every site, so this is done once per workspace. ``overrides``
    (``--set`` assignments) run a copy of the job written beside the workspace; ``rest`` are the simulator's flags.
    Replaces this process with NVFlare's simulator runner (:data:`SIMULATOR_MODULE`; returns only on an error
    before that)."""
    import importlib.util
    import os
    import sys

    from feddg.flare.site_policy import install_resources

    simulator_flags(rest)  # a mistyped flag fails here, naming it, not in NVFlare's log
    if not (Path(job) / "meta.json").is_file():
        raise ValueError(f"{job}: not a job folder (no meta.json); the jobs are under jobs/, e.g. jobs/prostate_ga")
    # The simulator clears its workspace when it starts: nothing but a folder of ours goes to it.
    workspace_path = guard_folder(workspace, "-w", inputs=[job], keeps=SIMULATOR_KEEPS)
    if overrides:
        from feddg.experiment import parse_overrides
        from feddg.jobs import override_job

        # Beside the workspace, not in it (the simulator clears its workspace); a folder of ours too, since an
        # earlier copy of the same job there is replaced.
        copies = guard_folder(workspace_path.with_name(f"{workspace_path.name}_job"), "-w (its job copy <-w>_job)",
                              inputs=[job])
        copy = override_job(Path(job), parse_overrides(overrides), copies / Path(job).resolve().name,
                            claim_as="feddg simulate --set")
        print(f"wrote {copy}: {job} with --set {' '.join(overrides)}", flush=True)
        job = str(copy)
    local = workspace_path / "local"
    install_resources(local)
    claim(workspace_path, "feddg simulate -w", inside="local")  # NVFlare keeps local/ when it clears the workspace
    configured = configure_simulated_sites(Path(job), local)
    if configured is not None:
        path, settings = configured
        print(f"this job asks the sites' own settings {settings}; all simulated sites are yours, so {path} sets "
              f"them", flush=True)
    if importlib.util.find_spec("nvflare") is None:
        raise OSError("NVFlare's simulator is not installed (no nvflare package); install the requirements first")
    pin = pinned_environment(cpu_pin_mode())  # FEDDG_CPU_PIN: the site processes inherit it (feddg.numerics)
    os.environ.update(pin)
    if len(pin) > 1:
        print(f"CPU numerics pinned: {' '.join(f'{k}={v}' for k, v in pin.items())}", flush=True)
    rest, site_processes = simulator_threads(Path(job), rest)
    site_processes *= concurrent_runs_from_env()  # every site process on the host: the sweep's runs at once
    command = simulator_command(job, workspace_path, rest)
    os.environ[SITE_PROCESSES_ENV] = str(site_processes)
    print(f"running NVFlare's simulator: {SITE_PROCESSES_ENV}={site_processes} {' '.join(command[2:])}", flush=True)
    os.execv(sys.executable, command)
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
