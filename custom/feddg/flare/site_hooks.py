"""Site hooks: what a method adds around a site's local training, composed instead of subclassing the executor.

Only one part of a method may set the sites' executor (ELCFS's episodic training, MLA's extra tasks), so a method
that only needs to add a value to the training result (GA's generalization gap) does it with a hook: a client
component of the job, named by id in the executor's ``site_hooks`` argument, which the executor calls before and
after each round's local training. Hooks of several parts compose (ELCFS + GA: ELCFS's executor with GA's hook).

What a hook returns goes into the training result's metadata, so it leaves the site: a hook declares the keys it
sends (:class:`feddg.flare.method_spec.SiteHook`), the executor refuses any other key, and the site's egress filter
lets exactly the declared keys out. Scalars only.

State a hook keeps between rounds lives in ``TrainingContext.state``, which the executor stores in the site's run
folder (with ``nvflare simulator -t`` smaller than the number of sites each task runs in a fresh process).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from nvflare.apis.fl_component import FLComponent

from feddg.config import FedDGConfig
from feddg.data.dataset import SliceSet


@dataclass
class TrainingContext:
    """What a hook sees of one round's local training at one site.

    Attributes:
        site: the site's name. round: the round being trained.
        cfg: the validated experiment. data: the site's splits ("train", "val", "test").
        device: where the model lives.
        received: the received global model's validation scores (``val_dice``, ``val_loss``; empty without a
            validation split).
        state: the hook's own state from the previous round it ran (empty at first); the executor stores whatever
            the hook leaves here after training.
    """

    site: str
    round: int
    cfg: FedDGConfig
    data: Mapping[str, SliceSet]
    device: torch.device
    received: Mapping[str, float]
    state: dict[str, Any] = field(default_factory=dict)


class TrainingHook(FLComponent):
    """Base class of a site hook: override either method; each returns metadata to add to the training result
    (only the keys the part declares in ``sends``)."""

    def before_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        """Called with the received global model before local training."""
        return {}

    def after_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        """Called with the site's model right after local training."""
        return {}
