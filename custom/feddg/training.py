"""Local training: the loop a site runs on its own data each round, free of NVFlare.

Loss: MONAI's Dice loss on sigmoid outputs (one channel per structure), as the papers train with a Dice loss.
FedProx: NVFlare's PTFedProxLoss adds mu/2 * ||w - w_global||^2 when ``fedprox_mu > 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from monai.losses import DiceLoss

from feddg.precision import Precision


# Adam's decay rates of its first and second moment estimates in every site's local training, whatever the method:
# ELCFS's setting (section 4.2: Adam, learning rate 1e-3, momentum 0.9 and 0.99), not PyTorch's default
# (0.9, 0.999). The other papers train otherwise (MLA-BIN: Adam at PyTorch's defaults, learning rate 0.01 with a
# decay schedule; gradient alignment: SGD). One setting for all methods, so that two methods differ only in what
# they add; a departure for those two, not measured against their own optimizers (docs/methods.md, "Where the
# shared local training departs from the papers").
LOCAL_ADAM_BETAS = (0.9, 0.99)


def local_optimizer(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """The optimizer of a site's local training: Adam with learning rate ``lr`` (``train.lr``) and
    :data:`LOCAL_ADAM_BETAS`. A fresh one each round; the executor restores its moments from the site's state where
    the job keeps them."""
    return torch.optim.Adam(params, lr=lr, betas=LOCAL_ADAM_BETAS)


def segmentation_loss() -> torch.nn.Module:
    """Soft Dice loss over the batch (``batch=True``): slices with little foreground do not dominate."""
    return DiceLoss(sigmoid=True, batch=True)


@dataclass
class LocalTrainResult:
    mean_loss: float
    steps: int  # optimizer steps taken this round
    extra: dict[str, float] = field(default_factory=dict)  # method-specific scalars for TensorBoard


def iterate_batches(loader: Iterable, epochs: int, max_steps: int | None) -> Iterator:
    """``epochs`` passes over ``loader``, or exactly ``max_steps`` batches when it is given."""
    if max_steps is None:
        for _ in range(epochs):
            yield from loader
        return
    produced = 0
    while produced < max_steps:
        before = produced
        for batch in loader:
            yield batch
            produced += 1
            if produced == max_steps:
                return
        if produced == before:  # an empty loader would loop forever
            return


def train_epochs(
    model: torch.nn.Module,
    loader: Iterable[dict[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
    fedprox_mu: float = 0.0,
    global_model: torch.nn.Module | None = None,
    max_steps: int | None = None,
    precision: Precision | None = None,
) -> LocalTrainResult:
    """Run ``epochs`` passes over ``loader`` (batches {"image": (B,C,H,W), "label": (B,L,H,W)}), or, when
    ``max_steps`` is given, exactly that many optimizer steps (passing over the loader as often as needed).

    ``precision`` (:class:`feddg.precision.Precision`): mixed precision of the forward pass; the loss is float32.

    Raises:
        FloatingPointError: the loss became NaN or infinite (the site's update must not be sent).
    """
    precision = precision or Precision("off", device)
    loss_fn = segmentation_loss()
    prox = None
    if fedprox_mu > 0:
        from nvflare.app_opt.pt.fedproxloss import PTFedProxLoss

        if global_model is None:
            raise ValueError("FedProx needs the received global model")
        prox = PTFedProxLoss(mu=fedprox_mu)
    model.train()
    total, steps = 0.0, 0
    for batch in iterate_batches(loader, epochs, max_steps):
        image = batch["image"].to(device, non_blocking=True)
        label = batch["label"].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            logits = model(image)
        loss = loss_fn(logits.float(), label)
        if prox is not None:
            loss = loss + prox(model, global_model)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"local loss is {loss.item()} at step {steps}")
        precision.backward(loss)
        precision.step(optimizer)
        total += float(loss.detach())
        steps += 1
    return LocalTrainResult(mean_loss=total / steps if steps else math.nan, steps=steps)
