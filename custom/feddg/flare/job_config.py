"""Find and read the job's ``feddg.yaml`` from inside a running NVFlare app."""

from __future__ import annotations

import os

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext

from feddg.config import FedDGConfig
from feddg.experiment import load_experiment
from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections


def config_path(fl_ctx: FLContext, config_file: str) -> str:
    """An absolute ``config_file`` is used as it is; a relative one is looked up in the app's config folder
    (next to config_fed_server.json / config_fed_client.json)."""
    if os.path.isabs(config_file):
        return config_file
    return os.path.join(fl_ctx.get_prop(FLContextKey.APP_ROOT), "config", config_file)


def load_job_config(fl_ctx: FLContext, config_file: str) -> FedDGConfig:
    """The job's experiment, validated with the registered methods' sections and checks."""
    return load_experiment(config_path(fl_ctx, config_file))
