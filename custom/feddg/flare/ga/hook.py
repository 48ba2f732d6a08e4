"""GA's site hook: the generalization gap each training site sends with its update (FedDG-GA, Eq. 2).

    G_i^r = L(theta^r; D_i) - L(theta_i^{r-1}; D_i)

the loss of the received global model minus the loss the site's own model had right after the previous round's
local training, both on the split ``ga.gap_split`` names: the training loss (Dice loss, pooled over the split's
images, :func:`feddg.evaluation.split_loss`) on its images as loaded, without augmentation.
One scalar per site and round leaves the site (``generalization_gap``); none in round 0, after a round the site
missed, or when that split is empty.

``ga.gap_split: train`` (the default) is the paper's: the empirical risk on the site's training set (Algorithm 1).
``ga.gap_split: val`` takes both losses on the validation split, as the authors' released code does; on the fundus
benchmark its gaps (4 validation images per site) made GA fall behind uniform weighting where the training-set
gaps did not (docs/methods.md, ``benchmarks/results/ga_gap_fundus``). ``benchmarks/ga_gaps.py`` measures what the
gaps did to the weights in a result set.
"""

from __future__ import annotations

import torch

from feddg.evaluation import split_loss
from feddg.flare.constants import FedDGMeta
from feddg.flare.ga.part import GENERALIZATION_GAP
from feddg.flare.site_hooks import TrainingContext, TrainingHook


class GeneralizationGap(TrainingHook):
    """Sends ``generalization_gap`` (a float) with each training result; keeps the loss of the site's
    post-training model on the gap's split as its state."""

    def before_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        previous, split = ctx.state, ctx.cfg.ga.gap_split
        if previous.get("round") != ctx.round - 1 or previous.get("split") != split or "local_loss" not in previous:
            return {}
        loss = _loss(ctx, model, received=True)
        return {} if loss is None else {GENERALIZATION_GAP: loss - previous["local_loss"]}

    def after_training(self, ctx: TrainingContext, model: torch.nn.Module) -> dict[str, float]:
        ctx.state.clear()
        loss = _loss(ctx, model, received=False)
        if loss is not None:
            ctx.state.update(round=ctx.round, split=ctx.cfg.ga.gap_split, local_loss=loss)
        return {}


def _loss(ctx: TrainingContext, model: torch.nn.Module, received: bool) -> float | None:
    """``model``'s loss on the split ``ga.gap_split`` names; None when the split is empty. The received model's
    validation loss is the one the executor already computed (``val_loss``), not computed twice."""
    split = ctx.cfg.ga.gap_split
    if received and split == "val":
        return ctx.received.get(FedDGMeta.VAL_LOSS)
    if not len(ctx.data[split]):
        return None
    return split_loss(model, ctx.data[split], ctx.device, ctx.cfg.eval.batch_size)
