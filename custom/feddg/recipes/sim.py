"""``--env sim``: NVFlare's ``SimEnv`` with the project's site policy and thread budget.

``SimEnv`` runs a job in ``<workspace_root>/<job name>`` (``NVFLARE_SIMULATOR_WORKSPACE_ROOT`` overrides the
argument). With no class allow-list in that workspace's ``local/`` it writes NVFlare's generic one, which refuses
the job's ``feddg`` components (``ComponentNotAuthorized``), while it keeps one that is there. So before each run
this environment writes the project's allow-list into ``local/resources.json`` (NVFlare's simulator copies
``local/`` to every site), the site settings the job's methods ask of the user's own sites (MLA: share the local
model, as ``feddg simulate`` does), and tells every site process how many run at once on this host
(``FEDDG_SITE_PROCESSES``, :mod:`feddg.compute`), so that together they use the cores once. The job runs in the
simulator runner ``feddg simulate`` uses (:mod:`feddg.flare.simulator`: NVFlare's, with a race closed that can give
two site processes one site's name), not the one ``SimEnv`` starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from nvflare.job_config.api import FedJob
from nvflare.private.fed.utils.fed_utils import split_gpus
from nvflare.recipe.sim_env import SimEnv

from feddg.compute import SITE_PROCESSES_ENV, concurrent_runs_from_env
from feddg.flare.constants import SIMULATOR_JOB
from feddg.flare.registry import simulated_site_config
from feddg.flare.site_config import SITE_CONFIG_FILE
from feddg.flare.site_policy import install_resources
from feddg.folders import claim
from feddg.process_tree import kill_tree
from feddg.report import REPORT_FILE
from feddg.simulate import simulator_command

if TYPE_CHECKING:
    from feddg.recipes.recipe import FedDGRecipe


class FedDGSimEnv(SimEnv):
    """``SimEnv`` for this project's recipes (see the module docstring).

    Args:
        clients: the simulated sites: the job's sites (``data.sites``), the held-out one included.
        workspace_root: the run's folder is ``<workspace_root>/<job name>`` (``NVFLARE_SIMULATOR_WORKSPACE_ROOT``,
            when set, wins, as in ``SimEnv``).
        num_threads: site processes at once (default: one per site, each living for the whole job).
        gpu_config, log_config: as in ``SimEnv``.
    """

    def __init__(self, *, clients: list[str], workspace_root: str | Path, num_threads: int | None = None,
                 gpu_config: str | None = None, log_config: str | None = None) -> None:
        super().__init__(clients=list(clients), workspace_root=str(workspace_root), num_threads=num_threads,
                         gpu_config=gpu_config, log_config=log_config)
        self.site_settings: dict[str, Any] = {}

    def prepare_for(self, recipe: FedDGRecipe) -> None:
        """Take the recipe's site settings (:func:`feddg.flare.registry.simulated_site_config`); ValueError when the
        simulated sites are not the job's."""
        if sorted(self.clients or []) != sorted(recipe.sites):
            raise ValueError(f"the simulated sites {self.clients} are not the sites of {recipe.name} "
                             f"{recipe.sites}")
        self.site_settings = simulated_site_config(recipe.component_paths)

    def workspace(self, job_name: str) -> Path:
        """The run's folder: ``<workspace_root>/<job name>``."""
        return Path(self.workspace_root) / job_name

    def report_path(self, job_name: str) -> Path:
        """Where the server writes the job's report in this environment."""
        return self.workspace(job_name) / "server" / SIMULATOR_JOB / REPORT_FILE

    def site_processes(self) -> int:
        """Site processes that run at once on this host, every concurrent run counted (``FEDDG_CONCURRENT_RUNS``):
        one per thread (at most one per site), or one per GPU group with several groups."""
        groups = split_gpus(self.gpu_config) if self.gpu_config else []
        if len(groups) > 1:  # NVFlare runs one client per GPU group at a time
            at_once = len(groups)
        else:
            at_once = max(1, min(self.num_threads, self.num_clients))
        return at_once * concurrent_runs_from_env()

    def install_policy(self, job_name: str) -> Path:
        """Write the project's allow-list (and the job's site settings, unless the user has that file already) into
        the run's ``local/``; returns its ``resources.json``."""
        local = self.workspace(job_name) / "local"
        resources = install_resources(local)
        claim(self.workspace(job_name), "python job.py --env sim", inside="local")  # kept when NVFlare clears it
        settings = local / SITE_CONFIG_FILE
        if self.site_settings and not settings.exists():
            settings.write_text(json.dumps(self.site_settings, indent=2) + "\n")
            print(f"this job asks the sites' own settings {self.site_settings}; all simulated sites are yours, so "
                  f"{settings} sets them", flush=True)
        return resources

    def simulate(self, job: FedJob) -> str:
        """What ``SimEnv.deploy`` does after its policy step, with the project's simulator runner
        (:func:`feddg.simulate.simulator_command`, which closes NVFlare 2.9's race that can give two site processes
        one site's name): the job written to a temporary folder and run from there with this environment's sites,
        threads, GPU groups and log config, in a session of its own. Returns the job's id (its name); RuntimeError
        naming the logs' folder when the simulator fails, as SimEnv's."""
        workspace = self.workspace(job.name)
        with tempfile.TemporaryDirectory() as root:
            job.export_job(root)
            flags = ["-c", ",".join(self.clients), "-t", str(self.num_threads)]
            if self.gpu_config:
                flags += ["-gpu", "".join(self.gpu_config.split())]
            if self.log_config:
                flags += ["-l", self.log_config]
            command = simulator_command(Path(root) / job.name, workspace, flags)
            returncode = subprocess.Popen(command, start_new_session=True).wait()
        self.last_run_failed = returncode != 0
        if self.last_run_failed:
            raise RuntimeError(f"Simulation failed with return code {returncode}. Logs are in per-site "
                               f"subdirectories under {workspace}, e.g. server/{SIMULATOR_JOB}/log.txt")
        return job.name

    def deploy(self, job: FedJob) -> str:
        """Install the policy, then run the job in the simulator (:meth:`simulate`) with the thread budget set for
        its site processes. Whatever stops the run (an error, Ctrl-C, SIGTERM) also stops every process it
        started."""
        self.install_policy(job.name)
        me = psutil.Process()
        before = {p.pid for p in me.children()}
        previous = os.environ.get(SITE_PROCESSES_ENV)
        os.environ[SITE_PROCESSES_ENV] = str(self.site_processes())
        try:
            return self.simulate(job)
        except BaseException:
            for child in me.children():  # the simulator this call started (it runs in a session of its own)
                if child.pid not in before:
                    kill_tree(child.pid)
                    try:
                        child.wait(timeout=5)  # reap it
                    except psutil.Error:
                        pass
            raise
        finally:
            if previous is None:
                os.environ.pop(SITE_PROCESSES_ENV, None)
            else:
                os.environ[SITE_PROCESSES_ENV] = previous
