"""The base of a method's server phase: a workflow that runs once, before or after the federated rounds (ELCFS's
amplitude exchange, MLA's feature bank and attention).

It reads the job's ``feddg.yaml`` when the phase starts (:attr:`ServerPhase.cfg`), needs nothing at its end, and
logs a late or unknown result instead of failing on it; a phase implements only ``control_flow``.
"""

from __future__ import annotations

from nvflare.apis.fl_context import FLContext
from nvflare.apis.impl.controller import Controller

from feddg.config import FedDGConfig
from feddg.flare.constants import CONFIG_FILE, TASK_CHECK_PERIOD
from feddg.flare.job_config import load_job_config


class ServerPhase(Controller):
    """Args:
    config_file: the job's ``feddg.yaml``, relative to the app's config folder.
    """

    def __init__(self, config_file: str = CONFIG_FILE):
        super().__init__(task_check_period=TASK_CHECK_PERIOD)
        self.config_file = config_file
        self._cfg: FedDGConfig | None = None

    @property
    def cfg(self) -> FedDGConfig:
        """The job's experiment, read when the phase started."""
        if self._cfg is None:
            raise RuntimeError(f"{type(self).__name__} has not started: the job's experiment is not read yet")
        return self._cfg

    def start_controller(self, fl_ctx: FLContext) -> None:
        self._cfg = load_job_config(fl_ctx, self.config_file)

    def stop_controller(self, fl_ctx: FLContext) -> None:
        pass

    def process_result_of_unknown_task(self, client, task_name, client_task_id, result, fl_ctx) -> None:
        self.log_warning(fl_ctx, f"ignoring a late or unknown result of task {task_name} from {client.name}")
