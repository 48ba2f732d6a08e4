"""The toy method's site hook: the L2 norm of the site's weight change in this round (one float)."""

from __future__ import annotations

import torch

from feddg.flare.site_hooks import TrainingContext, TrainingHook
from tests.toy_method.part import UPDATE_NORM


class UpdateNorm(TrainingHook):
    """Sends ``median_update_norm``: || theta_local - theta_received ||_2 over the floating-point weights."""

    def __init__(self):
        super().__init__()
        self._received: dict[str, torch.Tensor] = {}

    def before_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        self._received = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
        return {}

    def after_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        state = model.state_dict()
        squares = sum(float(((state[k] - v) ** 2).sum()) for k, v in self._received.items())
        return {UPDATE_NORM: squares ** 0.5}
