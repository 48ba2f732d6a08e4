"""NVFlare's PyTorch file persistor, with the network built from the job's ``feddg.yaml``."""

from __future__ import annotations

import torch
from nvflare.apis.fl_context import FLContext
from nvflare.app_opt.pt.file_model_persistor import PTFileModelPersistor

from feddg.flare.constants import CONFIG_FILE
from feddg.flare.job_config import config_path, load_job_config
from feddg.nets.unet import build_model


class FedDGModelPersistor(PTFileModelPersistor):
    """Keeps the last (``FL_global_model.pt``) and the best (``best_FL_global_model.pt``) global model in the
    server's app folder, like :class:`PTFileModelPersistor`, which does the saving and loading.

    The network is the one ``feddg.yaml`` describes, so the server and the sites cannot disagree on it, and the
    whole configuration is stored in each checkpoint's ``train_conf`` so that a saved model is self-contained:
    ``feddg evaluate`` rebuilds the network and its preprocessing from the file alone.

    Args:
        config_file: the job's experiment configuration, relative to the app's config folder.
        source_ckpt_file_full_name: optional checkpoint to start from (resuming a job); a relative path is read
            from the app's config folder, where `feddg resume-job` puts the previous run's model.
    """

    def __init__(self, config_file: str = CONFIG_FILE, source_ckpt_file_full_name: str | None = None):
        super().__init__(source_ckpt_file_full_name=source_ckpt_file_full_name)
        self.config_file = config_file

    def _initialize(self, fl_ctx: FLContext):
        self._cfg = load_job_config(fl_ctx, self.config_file)
        torch.manual_seed(self._cfg.train.seed)  # the initial global model is part of a reproducible run
        self.model = build_model(self._cfg)
        if self.source_ckpt_file_full_name:
            self.source_ckpt_file_full_name = config_path(fl_ctx, self.source_ckpt_file_full_name)
        super()._initialize(fl_ctx)

    def load_model(self, fl_ctx: FLContext):
        learnable = super().load_model(fl_ctx)
        # The parent sets train_conf to the class name only; store the whole configuration with the weights.
        self.persistence_manager.train_conf = {
            "train": {"model": type(self.model).__name__, "feddg_config": self._cfg.to_dict()}
        }
        return learnable
