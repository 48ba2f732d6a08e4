"""Mixed precision of the training loops (``train.amp``): the forward passes in bfloat16 or float16, the losses and
the weights in float32.

Modes:
  * ``auto``: bfloat16 on a CUDA device that supports it (float16 on older GPUs), off on the CPU (where autocast
    is slower than float32 for these convolutions);
  * ``bf16``: bfloat16 on CUDA or the CPU; no loss scaling (bfloat16 has float32's exponent range);
  * ``fp16``: float16 on CUDA with dynamic loss scaling (``torch.amp.GradScaler``); refused on the CPU;
  * ``off``: float32 throughout.

Covered: every site's local training (the Dice loss of FedAvg, FedProx, GA, gradient alignment and MLA-BIN's
BIN-Net, and ELCFS's episodic step with its InfoNCE boundary loss). Every loss is computed in float32 from
float32-cast network outputs (the Dice loss's sums and InfoNCE's similarities are where low precision would hurt),
and the weights the sites send are float32 whatever the mode. Not covered, on purpose: MLA's domain attention,
which the server trains on its CPU on one thread (:func:`feddg.methods.mla.attention.train_domain_attention`: a
small MLP on a few hundred feature vectors, where autocast has nothing to gain) and evaluation, which stays float32
so that metrics do not depend on the mode.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

AMP_MODES = ("auto", "bf16", "fp16", "off")


class PrecisionError(ValueError):
    """``train.amp`` asks for a precision the device cannot run; the message says which."""


def autocast_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``mode`` on ``device``; None: float32 throughout."""
    cuda = device.type == "cuda"
    if mode == "off":
        return None
    if mode == "auto":
        if not cuda:
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if mode == "bf16":
        if cuda and not torch.cuda.is_bf16_supported():
            raise PrecisionError("train.amp: bf16 is not supported by this GPU; use fp16, auto or off")
        return torch.bfloat16
    if mode == "fp16":
        if not cuda:
            raise PrecisionError(f"train.amp: fp16 needs a CUDA device, this site trains on {device.type}; "
                                 f"use auto, bf16 or off")
        return torch.float16
    raise PrecisionError(f"train.amp: expected one of {AMP_MODES}, got {mode!r}")


class Precision:
    """The precision of one training loop.

    Args:
        mode: ``train.amp``.
        device: the device the model trains on.

    Use::

        with precision.autocast():
            logits = model(x)
        loss = loss_fn(logits.float(), y)
        precision.backward(loss)
        precision.step(optimizer)
    """

    def __init__(self, mode: str = "off", device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.dtype = autocast_dtype(mode, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.dtype == torch.float16 else None

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self) -> AbstractContextManager:
        """The context of the forward passes."""
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def loss_scale(self) -> float:
        """The factor :meth:`backward` multiplies the loss by (1 without loss scaling); gradients a loop computes
        itself with ``torch.autograd.grad`` and adds to ``.grad`` must be multiplied by it too."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with loss scaling, unscaled first and skipped when a gradient overflowed."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def describe(self) -> str:
        if self.dtype is None:
            return "float32"
        return f"{str(self.dtype).removeprefix('torch.')} autocast" + (" with loss scaling" if self.scaler else "")
