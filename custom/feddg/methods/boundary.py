"""The boundary-oriented meta objective of ELCFS (Liu et al., CVPR 2021), section 3.3, Eq. (5)-(7).

Pure torch functions.

Masks: the boundary mask is the label minus its erosion; the background mask is the ring around the anatomy,
the label's dilation (5 iterations by default) minus the label (the paper: "background pixels around the anatomy
boundary instead of from the whole image"). Both use MONAI's morphology with a 3 x 3 square element, on tensors,
so they run on the training device; the paper does not name the element or the iteration count of the erosion
(one iteration: a one-pixel boundary).

Eq. (5): masked average pooling of the feature map Z (the last two decoder layers, bilinearly resized to the label
size and concatenated) over each mask: h_bd, h_bg, one D-vector each per view.

Eq. (6)-(7), over the 2V region features of one image and its V - 1 frequency-space counterparts (V views; the
paper's K): for a positive pair (h_m, h_p) of the same class,

    l(h_m, h_p) = -log( exp(h_m . h_p / tau) / sum_{q != m, q of the other class} exp(h_m . h_q / tau) )

with "." the cosine similarity and tau = 0.05; L_boundary averages l over the 2 B(V, 2) positive pairs m < p.

Two denominators (``denominator``):

* ``"negatives"``, Eq. (6) as printed: the indicator F is 1 for negative pairs only, so the denominator holds the
  negatives. The loss has no floor at zero and keeps pushing negatives apart at full strength (1 / tau = 20 times
  the scale of a cosine) long after positives are closer than negatives.
* ``"all"``, the InfoNCE of SimCLR that the paper cites for it ([6]): every other feature q != m, the positives
  included. The loss is >= 0 and fades once each positive dominates its row.

Measured with ``python benchmarks/elcfs_boundary_ablation.py`` (one synthetic prostate site, 10 local epochs, Dice
on the unseen RUNMC): plain training 0.32, episodic learning without the boundary term 0.40, with the printed
denominator 0.005 (gamma 0.5) and 0.011 (gamma 0.1), with ``"all"`` 0.46 (gamma 0.5). The jobs therefore use
``"all"`` (``elcfs.contrast_denominator``); the printed form stays one setting away for whoever reproduces it.

A structure whose label is empty in an image (no boundary or no ring) has no region features: that image and
structure are skipped. When nothing is left the loss is an exact zero connected to the features' graph, never NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from monai.transforms.utils_morphological_ops import dilate, erode


def boundary_masks(labels: torch.Tensor, dilation_iterations: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Boundary and surrounding-background masks of binary labels.

    Args:
        labels: (B, L, H, W) binary {0, 1} labels, one channel per structure.
        dilation_iterations: iterations of the 3 x 3 dilation that make the background ring.

    Returns:
        (boundary, background), each (B, L, H, W) float {0, 1}: label - erode(label) and dilate^n(label) - label.
    """
    b, n_labels, h, w = labels.shape
    # MONAI's morphology convolves with a (C, C, 3, 3) element, i.e. it mixes channels: each structure is
    # processed as its own one-channel image.
    y = (labels > 0.5).float().reshape(b * n_labels, 1, h, w)
    # pad_value 1 for the erosion: a structure that touches the frame has no boundary along the frame edge.
    eroded = erode(y, filter_size=3, pad_value=1.0)
    dilated = y
    for _ in range(dilation_iterations):
        dilated = dilate(dilated, filter_size=3, pad_value=0.0)
    boundary = (y - eroded).clamp_(0, 1).reshape(b, n_labels, h, w)
    return boundary, (dilated - y).clamp_(0, 1).reshape(b, n_labels, h, w)


def decoder_feature_map(features: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
    """Z: each feature map bilinearly resized to ``size`` and concatenated along channels -> (B, sum D_l, H, W)."""
    return torch.cat([F.interpolate(f, size=size, mode="bilinear", align_corners=False)
                      if f.shape[-2:] != size else f for f in features], dim=1)


def masked_average_pool(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. (5): sum_hw Z * m / sum_hw m.

    Args:
        z: (B, D, H, W) features.
        mask: (B, L, H, W) binary masks.

    Returns:
        (B, L, D) region features; rows whose mask is empty are zero (callers skip them).
    """
    area = mask.sum(dim=(-2, -1))  # (B, L)
    pooled = torch.einsum("bdhw,blhw->bld", z, mask)
    return pooled / area.clamp(min=1.0).unsqueeze(-1)


DENOMINATORS = ("negatives", "all")


def boundary_info_nce(
    h_bd: torch.Tensor, h_bg: torch.Tensor, tau: float = 0.05, denominator: str = "negatives"
) -> torch.Tensor:
    """Eq. (6)-(7) for groups of V views.

    Args:
        h_bd: (G, V, D) boundary features of G groups (image x structure), V views each (the raw image and its
            frequency-space counterparts).
        h_bg: (G, V, D) background features of the same groups.
        tau: temperature.
        denominator: "negatives" (Eq. 6 as printed) or "all" (SimCLR's InfoNCE: every q != m); see the module
            docstring.

    Returns:
        (G,) L_boundary of each group. Needs V >= 2 (a positive pair needs two views of one class).
    """
    g, v, _ = h_bd.shape
    if denominator not in DENOMINATORS:
        raise ValueError(f"denominator must be one of {DENOMINATORS}, got {denominator!r}")
    if v < 2:
        raise ValueError(f"the boundary loss needs at least two views per image, got {v}")
    h = F.normalize(torch.cat([h_bd, h_bg], dim=1), dim=-1)  # (G, 2V, D), boundary first
    logits = h @ h.transpose(1, 2) / tau  # (G, 2V, 2V) cosine similarities / tau
    cls = torch.arange(2 * v, device=h.device) >= v
    same = cls[:, None] == cls[None, :]
    upper = torch.ones(2 * v, 2 * v, dtype=torch.bool, device=h.device).triu(diagonal=1)
    positive = same & upper  # pairs (m, p), m < p, of the same class
    # log of the denominator of Eq. (6): the row's negatives only, or every other feature.
    excluded = same if denominator == "negatives" else torch.eye(2 * v, dtype=torch.bool, device=h.device)
    log_denominator = torch.logsumexp(logits.masked_fill(excluded, float("-inf")), dim=-1)  # (G, 2V)
    pair_loss = log_denominator[:, :, None] - logits  # l(h_m, h_p) for every (m, p)
    return (pair_loss * positive).sum(dim=(1, 2)) / positive.sum()


def boundary_loss(
    features: list[torch.Tensor],
    labels: torch.Tensor,
    views: int,
    tau: float = 0.05,
    dilation_iterations: int = 5,
    denominator: str = "negatives",
) -> torch.Tensor:
    """L_boundary(x, t) of a batch, averaged over images and structures that have a boundary.

    Args:
        features: decoder activations of the stacked batch [x; t_1; ...; t_{V-1}], each (V*B, D_l, H_l, W_l):
            first the B raw images, then the B images of each transformed view in turn.
        labels: (B, L, H, W) labels of the raw images; every view shares them (the transform keeps semantics).
        views: V, the number of views per image (1 + transformed images per image).
        tau: temperature of Eq. (6).
        dilation_iterations: width of the background ring.
        denominator: see :func:`boundary_info_nce`.

    Returns:
        A scalar; exactly 0 (still on the graph) when no image of the batch has any foreground.
    """
    b, n_labels, h, w = labels.shape
    z = decoder_feature_map(features, (h, w))  # (V*B, D, H, W)
    if z.shape[0] != views * b:
        raise ValueError(f"expected {views} views of {b} images in the features, got a batch of {z.shape[0]}")
    bd, bg = boundary_masks(labels, dilation_iterations)  # (B, L, H, W)
    reps = (views, 1, 1, 1)
    h_bd = masked_average_pool(z, bd.repeat(reps))  # (V*B, L, D)
    h_bg = masked_average_pool(z, bg.repeat(reps))
    valid = (bd.sum(dim=(-2, -1)) > 0) & (bg.sum(dim=(-2, -1)) > 0)  # (B, L)
    if not bool(valid.any()):
        return z.sum() * 0.0

    def groups(x: torch.Tensor) -> torch.Tensor:  # (V*B, L, D) -> (valid groups, V, D)
        x = x.reshape(views, b, n_labels, -1).permute(1, 2, 0, 3)  # (B, L, V, D)
        return x[valid]

    return boundary_info_nce(groups(h_bd), groups(h_bg), tau, denominator).mean()
