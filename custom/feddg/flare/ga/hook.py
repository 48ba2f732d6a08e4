"""GA's site hook: the generalization gap each training site sends with its update (FedDG-GA, Eq. 2).

    G_i^r = L(theta^r; D_i) - L(theta_i^{r-1}; D_i)

the validation loss of the received global model minus the validation loss the site's own model had right after
the previous round's local training, both on the site's validation split. One scalar per site and round leaves the
site (``generalization_gap``); none in round 0, after a round the site missed, or without a validation split.

Departure from the paper, not yet backed by a measurement: the paper takes both losses on the site's training set
(the empirical risk on D_i-hat, Algorithm 1); this hook takes them on the validation split (one pass over a small
split, not two over the training set, per round; noisier gaps). ``benchmarks/ga_gaps.py`` measures how much the
gaps' noise moves the weights in a result set (docs/methods.md).
"""

from __future__ import annotations

import torch

from feddg.evaluation import split_loss
from feddg.flare.constants import FedDGMeta
from feddg.flare.ga.part import GENERALIZATION_GAP
from feddg.flare.site_hooks import TrainingContext, TrainingHook


class GeneralizationGap(TrainingHook):
    """Sends ``generalization_gap`` (a float) with each training result; keeps the site's post-training
    validation loss as its state."""

    def before_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        loss, previous = ctx.received.get(FedDGMeta.VAL_LOSS), ctx.state
        if loss is None or previous.get("round") != ctx.round - 1 or "local_val_loss" not in previous:
            return {}
        return {GENERALIZATION_GAP: loss - previous["local_val_loss"]}

    def after_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        ctx.state.clear()
        if len(ctx.data["val"]):
            ctx.state.update(round=ctx.round, local_val_loss=split_loss(model, ctx.data["val"], ctx.device,
                                                                       ctx.cfg.eval.batch_size))
        return {}
