"""Scoring a model on a site's data: predictions, evaluation units, Dice/HD95/ASD summaries.

Evaluation unit: where the layout knows the voxel spacing (SAML NIfTI), a case's slices are stacked back into
its volume and scored in 3D, distances in mm; for PNG layouts each image is a unit and distances are in
pixels. The summary says which (``unit``).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch

from feddg.data.dataset import SliceSet
from feddg.metrics import case_metrics, largest_connected_component, summarize
from feddg.training import segmentation_loss


@torch.no_grad()
def predict_logits(
    model: torch.nn.Module, images: np.ndarray, device: torch.device, batch_size: int = 16
) -> np.ndarray:
    """Logits (N, L, H, W) float32 for images (N, C, H, W), in eval mode."""
    model.eval()
    out = []
    for start in range(0, len(images), batch_size):
        batch = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size])).to(device)
        out.append(model(batch).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0,), np.float32)


def evaluation_units(s: SliceSet) -> Iterator[tuple[str, np.ndarray, tuple[float, ...] | None]]:
    """Yield (unit id, row indices, spacing): one unit per volume when spacing is known, else per image."""
    if s.spacing is not None:
        for case_id, rows in s.case_indices().items():
            yield case_id, rows, tuple(s.spacing[case_id])
    else:
        for row in range(len(s)):
            yield f"{s.case_ids[row]}#{int(s.slice_index[row])}", np.array([row]), None


def _as_unit(masks: np.ndarray, rows: np.ndarray, volumetric: bool) -> np.ndarray:
    """(L, H, W) for an image, (L, H, W, D) for a volume whose slices are ``rows`` in slice order."""
    if volumetric:
        return np.moveaxis(masks[rows], 0, -1)
    return masks[rows[0]]


def _loss(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(segmentation_loss()(torch.from_numpy(logits), torch.from_numpy(labels.astype(np.float32))))


def split_loss(model: torch.nn.Module, s: SliceSet, device: torch.device, batch_size: int = 16) -> float:
    """The training loss (Dice loss) of ``model`` on ``s``, the same number as ``evaluate_sliceset``'s
    ``loss``, without the distance metrics."""
    return _loss(predict_logits(model, s.images, device, batch_size), s.labels)


def evaluate_sliceset(
    model: torch.nn.Module,
    s: SliceSet,
    label_names: Sequence[str],
    device: torch.device,
    batch_size: int = 16,
    largest_component: bool = False,
) -> dict[str, Any]:
    """Score ``model`` on ``s``: the summary of :func:`feddg.metrics.summarize` plus ``loss`` (the training loss,
    Dice pooled over the whole split: :func:`feddg.training.segmentation_loss`) and ``n_images``; ``cases`` lists
    the per-unit metrics."""
    if len(s) == 0:
        raise ValueError(f"site {s.site}: nothing to evaluate (empty split)")
    return score_logits(predict_logits(model, s.images, device, batch_size), s, label_names, largest_component)


def predicted_units(
    logits: np.ndarray, s: SliceSet, largest_component: bool = False
) -> Iterator[tuple[str, np.ndarray, np.ndarray, tuple[float, ...] | None]]:
    """Yield (unit id, prediction, reference, spacing) per evaluation unit of ``s`` (:func:`evaluation_units`):
    the binary masks the scores are computed on, (L, H, W) for an image or (L, H, W, D) for a volume, the
    prediction ``logits > 0`` (sigmoid > 0.5) from logits (N, L, H, W) predicted for ``s``'s images, reduced to its
    largest connected component per structure when ``largest_component``."""
    if logits.shape[0] != len(s):
        raise ValueError(f"site {s.site}: {logits.shape[0]} predictions for {len(s)} images")
    pred = logits > 0.0
    gt = s.labels.astype(bool)
    volumetric = s.spacing is not None
    for unit_id, rows, spacing in evaluation_units(s):
        p = _as_unit(pred, rows, volumetric)
        if largest_component:
            p = largest_connected_component(p)
        yield unit_id, p, _as_unit(gt, rows, volumetric), spacing


def score_logits(
    logits: np.ndarray, s: SliceSet, label_names: Sequence[str], largest_component: bool = False
) -> dict[str, Any]:
    """:func:`evaluate_sliceset` from logits (N, L, H, W) already predicted for ``s``'s images (by one model, or
    by one model per image as MLA's ``per_image`` mode does)."""
    if len(s) == 0:
        raise ValueError(f"site {s.site}: nothing to evaluate (empty split)")
    cases = []
    for unit_id, p, g, spacing in predicted_units(logits, s, largest_component):
        result = case_metrics(p, g, spacing)
        result["case_id"] = unit_id
        cases.append(result)
    summary = summarize(cases, label_names, "mm" if s.spacing is not None else "px")
    summary["loss"] = _loss(logits, s.labels)
    summary["n_images"] = int(len(s))
    return {"summary": summary, "cases": cases}


def validation_scores(
    model: torch.nn.Module, s: SliceSet, label_names: Sequence[str], device: torch.device, batch_size: int = 16
) -> dict[str, float]:
    """The two numbers a round needs from a site's validation split: ``{"dice": the mean over structures of the
    mean Dice over evaluation units (:func:`mean_dice` of :func:`evaluate_sliceset`'s summary), "loss": the
    training loss}``, without the surface distances (measured: 0.40 s -> 0.16 s for a prostate site's 24
    validation slices at 64 px on one CPU thread, once per site and round)."""
    if len(s) == 0:
        raise ValueError(f"site {s.site}: nothing to validate on (empty split)")
    logits = predict_logits(model, s.images, device, batch_size)
    pred, gt, volumetric = logits > 0.0, s.labels.astype(bool), s.spacing is not None
    per_structure = [[] for _ in label_names]
    for _, rows, spacing in evaluation_units(s):
        result = case_metrics(_as_unit(pred, rows, volumetric), _as_unit(gt, rows, volumetric), spacing,
                              distances=False)
        for l, scores in enumerate(per_structure):
            scores.append(result[str(l)]["dice"])
    return {"dice": float(np.mean([np.mean(d) for d in per_structure])), "loss": _loss(logits, s.labels)}


def mean_dice(summary: dict[str, Any], label_names: Sequence[str]) -> float:
    """Mean Dice over structures of one summary (the number used to select the best model)."""
    return float(np.mean([summary[name]["dice"]["mean"] for name in label_names]))
