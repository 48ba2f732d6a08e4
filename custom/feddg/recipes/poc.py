"""``--env poc``: the job in a local multi-site POC with the consortium's kits and site policy (:mod:`feddg.poc`).

NVFlare's ``PocEnv`` cannot serve here: its ``deploy`` stops and cleans any running POC and provisions a new one
(the site policy installed into the kits is lost), logs in with the project admin's kit whatever user it is given
(only a hospital lead may submit in this project), keeps no handles of the processes it starts, and
``Run.get_result()`` deletes the POC workspace by default. This environment instead, on top of :mod:`feddg.poc`:

1. exports the job and prepares a POC of the job's sites with the consortium's project and the site policy;
2. starts the server and every site, each one process it owns;
3. submits as the first hospital's lead;
4. waits for the job with a bound, downloads the result into ``<workspace>/results/<job id>``;
5. stops every process it started by process id (:meth:`stop`; also when anything above fails or is
   interrupted), and keeps the workspace unless asked to clean up.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from nvflare.job_config.api import FedJob
from nvflare.recipe.spec import ExecEnv

from feddg import poc
from feddg.experiment import load_experiment
from feddg.flare.constants import CONFIG_FILE

COMPLETED = "FINISHED:COMPLETED"
DEFAULT_WORKSPACE = Path("/tmp/feddg/poc")


class FedDGPocEnv(ExecEnv):
    """A POC of the job's sites on this machine (see the module docstring).

    Args:
        workspace: the POC's folder (deleted and recreated by :meth:`deploy`).
        timeout: seconds :meth:`get_job_result` waits for the job when given no timeout of its own.
    """

    def __init__(self, workspace: str | Path = DEFAULT_WORKSPACE, timeout: float = 3600) -> None:
        super().__init__()
        if not timeout > 0:
            raise ValueError(f"--timeout {timeout:g}: give a positive number of seconds")
        self.workspace = Path(workspace).expanduser().resolve()
        self.timeout = timeout
        self.poc: poc.POC | None = None
        self._status: dict[str, str] = {}

    def deploy(self, job: FedJob) -> str:
        """Prepare and start the POC of the job's sites, submit the job as a lead; returns the job id."""
        with tempfile.TemporaryDirectory() as tmp:
            job.export_job(tmp)
            exported = Path(tmp) / job.name
            cfg = load_experiment(exported / "app" / "config" / CONFIG_FILE)
            self.poc = poc.prepare(self.workspace, cfg.data.task, list(cfg.data.sites))
            submitted = shutil.copytree(exported, self.workspace / "jobs" / job.name)
        try:
            poc.start(self.poc)
            print(f"POC up: server + {self.poc.clients}; {self.poc.lead} submits {job.name}", flush=True)
            job_id = poc.submit(self.poc, Path(submitted))
        except BaseException:
            self.stop()
            raise
        self._status[job_id] = "SUBMITTED"
        print(f"job {job_id} submitted", flush=True)
        return job_id

    def get_job_status(self, job_id: str) -> str | None:
        """The job's last status this environment saw (``SUBMITTED``, then its final one), None for another job."""
        return self._status.get(job_id)

    def abort_job(self, job_id: str) -> None:
        if self.poc is not None and self.poc.processes:
            poc.admin(self.poc, ["abort", job_id, "--force"], 120, "job abort", check=False)

    def get_job_result(self, job_id: str, timeout: float = 0.0) -> str:
        """Wait for the job (``timeout`` s, or the environment's when 0) and download its result; returns the
        download folder. RehearsalError naming the status and the server's errors when it did not complete."""
        if self.poc is None:
            raise poc.RehearsalError(f"job {job_id}: no POC was deployed by this environment")
        status = poc.wait(self.poc, job_id, timeout or self.timeout)
        self._status[job_id] = status
        results = self.workspace / "results" / job_id
        if status != COMPLETED:
            errors = poc.server_errors(self.poc, job_id, results)
            raise poc.RehearsalError(f"job {job_id} ended with {status}; the server's errors:\n{errors}\n(logs: "
                                     f"{results}, sites: {self.workspace / 'logs'})")
        poc.download(self.poc, job_id, results)
        return str(results)

    def stop(self, clean_up: bool = False) -> None:
        """Stop every process this environment started, by process id; with ``clean_up`` remove the workspace."""
        if self.poc is not None:
            poc.stop(self.poc)
        if clean_up and self.workspace.exists():
            shutil.rmtree(self.workspace)
