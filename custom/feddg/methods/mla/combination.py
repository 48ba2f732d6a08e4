"""Eq. (4) of MLA-BIN (Zhu et al.), section 2.2: the global model for an unseen domain is the attention-weighted
sum of the K sites' local models::

      G(m) = sum_i D_i^w l_i(m)                                   (:func:`combine_state_dicts`)

with the weights D^w from :func:`feddg.methods.mla.attention.attention_weights`, and the checks that the state dicts
can be combined (:func:`check_state_dicts`) and the weights are a probability vector (:func:`check_weights`).

Choice the paper leaves open (no public code exists): **integer buffers** (BatchNorm's ``num_batches_tracked``)
are combined with the same weights and rounded; boolean buffers are taken from the model with the largest weight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

WEIGHT_SUM_TOLERANCE = 1e-5


def _label(i: int, labels: Sequence[str] | None) -> str:
    return f"model {i}" if labels is None else f"model {i} ({labels[i]})"


def check_state_dicts(states: Sequence[Mapping[str, torch.Tensor]], labels: Sequence[str] | None = None) -> None:
    """Raise ValueError unless every state dict has the keys, shapes and dtype kinds of the first one.

    The message names the first differing key (in model 0's key order, then in model i's) and the two models, by
    index and, when ``labels`` are given, by name.
    """
    if not states:
        raise ValueError("no state dicts to combine")
    if labels is not None and len(labels) != len(states):
        raise ValueError(f"{len(labels)} labels for {len(states)} state dicts")
    ref = states[0]
    for i in range(1, len(states)):
        other = states[i]
        missing = [k for k in ref if k not in other]
        if missing:
            raise ValueError(f"state dicts disagree in keys: {missing[0]!r} is in {_label(0, labels)} but not in "
                             f"{_label(i, labels)}")
        extra = [k for k in other if k not in ref]
        if extra:
            raise ValueError(f"state dicts disagree in keys: {extra[0]!r} is in {_label(i, labels)} but not in "
                             f"{_label(0, labels)}")
        for k, a in ref.items():
            b = other[k]
            if tuple(a.shape) != tuple(b.shape):
                raise ValueError(f"state dicts disagree in shapes: {k!r} is {tuple(a.shape)} in {_label(0, labels)} "
                                 f"but {tuple(b.shape)} in {_label(i, labels)}")
            if _kind(a) != _kind(b):
                raise ValueError(f"state dicts disagree in dtypes: {k!r} is {a.dtype} in {_label(0, labels)} "
                                 f"but {b.dtype} in {_label(i, labels)}")


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_floating_point() or t.is_complex():
        return "float"
    return "int"


def check_weights(weights: Sequence[float] | np.ndarray | torch.Tensor, n: int) -> np.ndarray:
    """The weights as a float64 array of length ``n``; ValueError unless they are finite, non-negative and sum to 1
    within ``WEIGHT_SUM_TOLERANCE``."""
    if isinstance(weights, torch.Tensor):
        w = weights.detach().cpu().to(torch.float64).numpy()
    else:
        w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"expected {n} weights (one per model), got shape {tuple(w.shape)}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be finite, got {w.tolist()}")
    if np.any(w < 0):
        raise ValueError(f"weights must be non-negative, got {w.tolist()}")
    if abs(w.sum() - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise ValueError(f"weights must sum to 1 (within {WEIGHT_SUM_TOLERANCE}), got sum {w.sum():.8g}")
    return w


def combine_state_dicts(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float] | np.ndarray | torch.Tensor,
    labels: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Eq. (4): G = sum_i D^w_i l_i, entry by entry over K state dicts.

    Args:
        states: K state dicts with identical keys and shapes (checked first, see :func:`check_state_dicts`).
        weights: K finite, non-negative weights summing to 1 (within ``WEIGHT_SUM_TOLERANCE``), e.g. the output of
            :func:`~feddg.methods.mla.attention.attention_weights` in ``"mean"`` mode.
        labels: optional K names (sites) used in error messages.

    Returns:
        A new state dict in model 0's key order, each entry a new tensor with model 0's dtype and device:

        * floating-point (and complex) entries: the weighted sum, accumulated in float64 (complex128) and cast back.
          Models with weight exactly 0 are skipped, so a one-hot weight vector returns that model's tensors exactly
          (bit for bit) and a zero-weight model's NaN/Inf cannot leak in (0 * inf is NaN).
        * integer entries (BatchNorm's ``num_batches_tracked``): the same weighted sum, rounded to the nearest
          integer. It equals the common value when all models agree and the chosen model's value for one-hot
          weights. (The counter only matters for BatchNorm with ``momentum=None``.)
        * boolean entries: copied from the model with the largest weight (the first one on ties).

    Raises:
        ValueError: keys, shapes or dtype kinds disagree (naming the first differing key and both models), or the
            weights are of the wrong length, negative, non-finite or do not sum to 1.
    """
    check_state_dicts(states, labels)
    w = check_weights(weights, len(states))
    used = [i for i in range(len(states)) if w[i] != 0.0]
    top = int(np.argmax(w))
    out: dict[str, torch.Tensor] = {}
    for key, ref in states[0].items():
        kind = _kind(ref)
        if kind == "bool":
            out[key] = states[top][key].detach().clone().to(ref.device)
            continue
        acc_dtype = torch.complex128 if ref.is_complex() else torch.float64
        acc = torch.zeros(ref.shape, dtype=acc_dtype, device=ref.device)
        for i in used:
            acc += float(w[i]) * states[i][key].detach().to(device=ref.device, dtype=acc_dtype)
        if kind == "int":
            acc = torch.round(acc)
        out[key] = acc.to(ref.dtype)
    return out
