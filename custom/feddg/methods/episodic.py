"""Boundary-oriented episodic learning, ELCFS (Liu et al., CVPR 2021), section 3.3, Eq. (4), (8), (9).

One episodic step on a batch x (meta-train) and its frequency-space counterparts t (meta-test):

    Eq. (4)  theta'  = theta - beta * grad_theta L_seg(x; theta)                     (inner step, beta = 1e-3)
    Eq. (8)  L_meta  = L_seg(t; theta') + gamma * L_boundary(x, t; theta')
    Eq. (9)  minimise L_seg(x; theta) + L_meta  with respect to theta               (Adam in the caller)

First order (the default, what the authors released): theta' is built from the inner gradient without its graph,
so d theta' / d theta = I and the gradient of Eq. (9) is g + grad_{theta'} L_meta, g = grad_theta L_seg(x; theta).
Computed that way, a step costs one forward/backward of x under theta plus one forward/backward of the stacked
[x; t] under theta' (x must be forwarded under theta' too: the boundary term contrasts its features with t's), the
floor of (2 + n_t) FedAvg steps for n_t transformed images per image. Second order keeps the inner gradient's
graph (``create_graph=True``) and back-propagates through it: (I - beta H) grad_{theta'} L_meta, at the price of a
double backward.

Normalisation buffers (BatchNorm running statistics) are shared by both forwards, so they see x under theta and
[x; t] under theta'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.func import functional_call

from feddg.methods.frequency import interpolate_amplitude, sample_transfers


class Precision(Protocol):
    """Mixed precision of the forward passes (``feddg.precision.Precision`` is one; the paper math does not import
    the package's machinery). None everywhere below means float32 throughout."""

    loss_scale: float  # the factor backward() multiplies the loss by

    def autocast(self) -> AbstractContextManager: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, optimizer: torch.optim.Optimizer) -> None: ...


def _widened(x: torch.Tensor) -> torch.Tensor:
    """An autocast output back in float32 for the losses (other dtypes, float64 in the tests, stay as they are)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class _Float32:
    loss_scale = 1.0

    def autocast(self) -> AbstractContextManager:
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


class _WithFeatures(torch.nn.Module):
    """Calls ``net.forward_with_features`` so that :func:`torch.func.functional_call` can run it with theta'."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor):
        return self.net.forward_with_features(x)


@dataclass
class EpisodicLosses:
    inner: float  # L_seg(x; theta)
    meta_seg: float  # L_seg(t; theta')
    boundary: float  # L_boundary(x, t; theta')

    @property
    def total(self) -> float:
        """Eq. (9) with gamma already applied to the boundary term."""
        return self.inner + self.meta_seg + self.boundary


def episodic_step(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    t: torch.Tensor,
    seg_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    boundary: Callable[[list[torch.Tensor], torch.Tensor, int], torch.Tensor] | None,
    meta_step_size: float = 1e-3,
    boundary_weight: float = 0.5,
    second_order: bool = False,
    precision: Precision | None = None,
) -> EpisodicLosses:
    """Accumulate the gradient of Eq. (9) into the parameters' ``.grad`` (the caller zeroes and steps, through
    ``precision.step`` when it scales the loss).

    Args:
        model: a network with ``forward(x) -> logits`` and ``forward_with_features(x) -> (logits, [features])``.
        x: (B, C, H, W) raw images (meta-train).
        y: (B, L, H, W) their labels, shared by every view.
        t: (n_t * B, C, H, W) transformed images (meta-test), view-major: the B images of view 1, then view 2...
        seg_loss: L_seg(logits, labels).
        boundary: L_boundary(features of [x; t], y, views) or None to drop the term (ablation "without boundary").
        meta_step_size: beta of Eq. (4).
        boundary_weight: gamma of Eq. (8).
        second_order: back-propagate through the inner gradient.
        precision: mixed precision of the two forward passes (:class:`Precision`); the losses, the inner
            gradient and theta' are float32. With loss scaling the accumulated ``.grad`` is in scaled units.

    Returns:
        The three terms' values; raises FloatingPointError when any is not finite (no gradient is then usable).
    """
    precision = precision or _Float32()
    scale = precision.loss_scale
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())
    with precision.autocast():
        inner_logits = model(x)
    inner = seg_loss(_widened(inner_logits), y)
    grads = torch.autograd.grad(inner * scale if scale != 1 else inner, list(params.values()),
                                create_graph=second_order)
    if scale != 1:  # the inner step of Eq. (4) takes the true gradient
        grads = tuple(g / scale for g in grads)
    fast = {n: p - meta_step_size * (g if second_order else g.detach()) for (n, p), g in zip(params.items(), grads)}
    views = 1 + t.shape[0] // x.shape[0]
    with precision.autocast():
        logits, features = functional_call(_WithFeatures(model), {**{f"net.{k}": v for k, v in fast.items()},
                                                                 **{f"net.{k}": v for k, v in buffers.items()}},
                                           (torch.cat([x, t]),))
    logits, features = _widened(logits), [_widened(f) for f in features]
    b = x.shape[0]
    meta_seg = seg_loss(logits[b:], y.repeat(views - 1, 1, 1, 1))
    bnd = boundary(features, y, views) * boundary_weight if boundary is not None else logits.sum() * 0.0
    values = EpisodicLosses(float(inner.detach()), float(meta_seg.detach()), float(bnd.detach()))
    if not all(map(torch.isfinite, (inner.detach(), meta_seg.detach(), bnd.detach()))):
        raise FloatingPointError(f"episodic losses not finite: {values}")
    meta = meta_seg + bnd
    if second_order:
        precision.backward(inner + meta)
    else:
        precision.backward(meta)
        for p, g in zip(params.values(), grads):
            g = g * scale if scale != 1 else g  # .grad holds scaled gradients under loss scaling
            p.grad = g.clone() if p.grad is None else p.grad.add_(g)
    return values


def transformed_views(
    x: torch.Tensor,
    bank: dict[str, torch.Tensor],
    own_site: str,
    transforms_per_image: int | None,
    lam_range: tuple[float, float],
    generator: torch.Generator,
) -> torch.Tensor:
    """t: for each image of x, n_t images whose low-frequency amplitude moves towards other sites' (Eq. 2-3).

    Args:
        x: (B, C, H, W) local images.
        bank: site -> (N_site, C, 2 b_h + 1, 2 b_w + 1) amplitude windows, on x's device.

    Returns:
        (n_t * B, C, H, W), view-major (see :func:`episodic_step`).
    """
    picks, lam = sample_transfers({s: int(a.shape[0]) for s, a in bank.items()}, own_site, x.shape[0],
                                  transforms_per_image, lam_range, generator)
    n_t = lam.shape[1]
    windows = torch.stack([torch.stack([bank[s][j] for s, j in row]) for row in picks])  # (B, n_t, C, h, w)
    windows = windows.transpose(0, 1).reshape(n_t * x.shape[0], *windows.shape[2:])
    return interpolate_amplitude(x.repeat(n_t, 1, 1, 1), windows, lam.t().reshape(-1).to(x.device))


@dataclass
class EpisodicTrainResult:
    mean_loss: float  # mean of Eq. (9) over the steps
    mean_boundary: float  # mean of gamma * L_boundary
    steps: int


def train_episodic(
    model: torch.nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    bank: dict[str, torch.Tensor],
    own_site: str,
    seg_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    boundary: Callable[[list[torch.Tensor], torch.Tensor, int], torch.Tensor] | None,
    transforms_per_image: int | None = None,
    lam_range: tuple[float, float] = (0.0, 1.0),
    meta_step_size: float = 1e-3,
    boundary_weight: float = 0.5,
    second_order: bool = False,
    seed: int = 0,
    precision: Precision | None = None,
) -> EpisodicTrainResult:
    """ELCFS local training: one episodic step per batch of ``batches`` ({"image", "label"} tensors)."""
    precision = precision or _Float32()
    generator = torch.Generator().manual_seed(seed)
    model.train()
    total = bnd = 0.0
    steps = 0
    for batch in batches:
        x = batch["image"].to(device, non_blocking=True)
        y = batch["label"].to(device, non_blocking=True).float()
        t = transformed_views(x, bank, own_site, transforms_per_image, lam_range, generator)
        optimizer.zero_grad(set_to_none=True)
        losses = episodic_step(model, x, y, t, seg_loss, boundary, meta_step_size, boundary_weight, second_order,
                               precision)
        precision.step(optimizer)
        total += losses.total
        bnd += losses.boundary
        steps += 1
    n = max(steps, 1)
    return EpisodicTrainResult(mean_loss=total / n if steps else float("nan"), mean_boundary=bnd / n, steps=steps)
