"""Segmentation metrics for one case and their summary over a test set.

Metrics (computed by MONAI, one value per structure):

- ``dice``: Dice similarity coefficient, ``2 |P ∩ G| / (|P| + |G|)``.
- ``hd95``: 95th percentile Hausdorff distance (``monai.metrics.compute_hausdorff_distance`` with
  ``percentile=95``): the larger of the two directed 95th percentiles of surface-to-surface distances.
- ``asd``: symmetric average surface distance (``compute_average_surface_distance(symmetric=True)``):
  the mean over the surface voxels of *both* masks of the distance to the other mask's surface.

Surfaces are MONAI's: the mask minus its binary erosion (the object's own boundary voxels), and
distances run between voxel centres. With ``spacing`` (mm per voxel along each spatial axis) the
distances are in mm; without it they are in pixels (voxels).

Empty-mask convention (MONAI would return NaN or inf here, which would poison every mean):

==============================  =====  ===============  ================
case                            dice   hd95 and asd      ``"empty"`` flag
==============================  =====  ===============  ================
both prediction and GT empty    1.0    0.0              ``"both"``
prediction empty, GT not        0.0    image diagonal    ``"pred"``
GT empty, prediction not        0.0    image diagonal    ``"gt"``
neither empty                   MONAI  MONAI             ``""``
==============================  =====  ===============  ================

The image diagonal is ``sqrt(sum((n_i * s_i) ** 2))`` over the spatial axes (``n_i`` voxels of
spacing ``s_i``; ``s_i = 1`` without spacing): the length of the image's bounding box, an upper bound
of every distance inside it. It keeps means finite while still penalising the miss heavily, and the
flag lets reports count such cases (``summarize`` reports ``empty_pred`` and ``empty_gt``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.metrics import compute_average_surface_distance, compute_dice, compute_hausdorff_distance
from skimage.measure import label as connected_components

METRICS = ("dice", "hd95", "asd")


def _as_binary(name: str, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != bool:
        values = np.unique(a)
        if not np.all(np.isin(values, (0, 1))):
            raise ValueError(f"{name} must be binary (0/1 or bool), found values {values[:8].tolist()}")
        a = a.astype(bool)
    return a


def image_diagonal(spatial_shape: Sequence[int], spacing: Sequence[float] | None = None) -> float:
    """Length of the image's diagonal, ``sqrt(sum((n_i * s_i)^2))``; in mm with spacing, else pixels."""
    s = [1.0] * len(spatial_shape) if spacing is None else [float(x) for x in spacing]
    return float(math.sqrt(sum((n * si) ** 2 for n, si in zip(spatial_shape, s))))


def case_metrics(
    pred: np.ndarray, gt: np.ndarray, spacing: Sequence[float] | None = None, distances: bool = True
) -> dict[str, dict[str, float | str]]:
    """Dice, HD95 and symmetric ASD of each structure of one case (Dice alone with ``distances=False``: the
    surface distances cost most of the time, and the rounds' validation needs only Dice).

    Args:
        pred: binary prediction, shape ``(L, *spatial)`` with 2 or 3 spatial axes, one channel per
            structure (multi-label: channels may overlap, e.g. fundus disc contains cup).
        gt: binary ground truth, same shape as ``pred``.
        spacing: voxel size along each spatial axis (mm); ``None`` measures distances in pixels.

    Returns:
        ``{str(l): {"dice": float, "hd95": float, "asd": float, "empty": "" | "pred" | "gt" | "both"}}``
        (without ``hd95`` and ``asd`` when ``distances`` is False)
        for each structure index ``l`` in ``range(L)``, keyed by the index as a string (``"0"``,
        ``"1"``) so that the result is JSON-ready and a ``"case_id"`` key can sit beside them; every
        value is finite (see the module docstring for the empty-mask convention).
    """
    p = _as_binary("pred", pred)
    g = _as_binary("gt", gt)
    if p.shape != g.shape:
        raise ValueError(f"pred and gt must have the same shape, got {p.shape} and {g.shape}")
    if p.ndim not in (3, 4):
        raise ValueError(f"expected (L, H, W) or (L, H, W, D) arrays, got shape {p.shape}")
    spatial = p.shape[1:]
    if spacing is not None:
        spacing = [float(s) for s in spacing]
        if len(spacing) != len(spatial) or not all(s > 0 and math.isfinite(s) for s in spacing):
            raise ValueError(f"spacing must give {len(spatial)} positive values, got {spacing}")
    diagonal = image_diagonal(spatial, spacing)

    out: dict[str, dict[str, float | str]] = {}
    for l in range(p.shape[0]):
        has_p, has_g = bool(p[l].any()), bool(g[l].any())
        if not has_p and not has_g:
            values = {"dice": 1.0, "hd95": 0.0, "asd": 0.0}
            out[str(l)] = {**_kept(values, distances), "empty": "both"}
            continue
        if not has_p or not has_g:
            values = {"dice": 0.0, "hd95": diagonal, "asd": diagonal}
            out[str(l)] = {**_kept(values, distances), "empty": "gt" if has_p else "pred"}
            continue
        # MONAI wants (B, C, *spatial); one batch item, one channel (it is the structure, not a
        # background channel, hence include_background=True).
        yp = torch.from_numpy(p[l][None, None].astype(np.float32))
        yt = torch.from_numpy(g[l][None, None].astype(np.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MONAI warns about empty masks; handled above
            values = {"dice": float(compute_dice(yp, yt, include_background=True).item())}
            if distances:
                values["hd95"] = float(compute_hausdorff_distance(
                    yp, yt, include_background=True, percentile=95, spacing=spacing).item())
                values["asd"] = float(compute_average_surface_distance(
                    yp, yt, include_background=True, symmetric=True, spacing=spacing).item())
        bad = [k for k, v in values.items() if not math.isfinite(v)]
        if bad:  # cannot happen for non-empty masks; refuse to hand a NaN to the reports
            raise RuntimeError(f"structure {l}: MONAI returned non-finite {bad}: {values}")
        out[str(l)] = {**values, "empty": ""}
    return out


def _kept(values: dict[str, float], distances: bool) -> dict[str, float]:
    return values if distances else {"dice": values["dice"]}


def _structure(result: Mapping[Any, Any], l: int) -> Mapping[str, Any]:
    # case_metrics keys structures by str(l); integer keys are accepted too for hand-built results.
    if str(l) in result:
        return result[str(l)]
    if l in result:
        return result[l]
    raise KeyError(f"case {result.get('case_id', '?')!r} has no metrics for structure {l}")


def summarize(results: list[dict], label_names: Sequence[str], unit: str) -> dict:
    """Mean and standard deviation of each metric over cases, per structure.

    Args:
        results: ``case_metrics`` outputs, one per case (a ``"case_id"`` key may be added).
        label_names: structure names; ``label_names[l]`` names structure index ``l``.
        unit: unit of hd95 and asd, ``"mm"`` or ``"px"``; copied to the output.

    Returns:
        ``{name: {"dice": {"mean", "std"}, "hd95": {...}, "asd": {...}, "n_cases": int,
        "empty_pred": int, "empty_gt": int, "empty_both": int}, "unit": unit}``. ``std`` is the
        population standard deviation (ddof=0, so it is 0.0, not NaN, for a single case). ``empty_pred``
        counts cases whose prediction is empty while the ground truth is not, ``empty_gt`` the
        reverse, ``empty_both`` cases where both are empty. All numbers are finite Python floats/ints.
    """
    if unit not in ("mm", "px"):
        raise ValueError(f"unit must be 'mm' or 'px', got {unit!r}")
    if not results:
        raise ValueError("summarize: no case results to summarize")
    summary: dict[str, Any] = {}
    for l, name in enumerate(label_names):
        per_case = [_structure(r, l) for r in results]
        entry: dict[str, Any] = {}
        for metric in METRICS:
            values = np.array([float(c[metric]) for c in per_case], dtype=np.float64)
            if not np.all(np.isfinite(values)):
                raise ValueError(f"{name}.{metric}: non-finite values in the case results")
            entry[metric] = {"mean": float(values.mean()), "std": float(values.std())}
        flags = [c.get("empty", "") for c in per_case]
        entry["n_cases"] = len(per_case)
        entry["empty_pred"] = flags.count("pred")
        entry["empty_gt"] = flags.count("gt")
        entry["empty_both"] = flags.count("both")
        summary[name] = entry
    summary["unit"] = unit
    return summary


def largest_connected_component(mask: np.ndarray) -> np.ndarray:
    """Keep only the largest connected component of each channel.

    Args:
        mask: binary array ``(L, *spatial)`` (2 or 3 spatial axes).

    Returns:
        Array of the same shape and dtype; an empty channel stays empty. Connectivity is full
        (8-neighbourhood in 2D, 26 in 3D, as MONAI's ``KeepLargestConnectedComponent`` default);
        on a tie in size the component met first in raster order is kept, so the result is
        deterministic.
    """
    m = _as_binary("mask", mask)
    if m.ndim < 2:
        raise ValueError(f"expected (L, *spatial), got shape {m.shape}")
    out = np.zeros_like(m)
    for l in range(m.shape[0]):
        labels = connected_components(m[l], connectivity=m[l].ndim)
        if labels.max() == 0:
            continue
        sizes = np.bincount(labels.ravel())
        sizes[0] = 0  # background
        out[l] = labels == int(np.argmax(sizes))  # argmax takes the first (lowest label) on ties
    return out.astype(np.asarray(mask).dtype, copy=False)
