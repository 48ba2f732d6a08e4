"""Training augmentation: random rotation, scaling and flipping, as in the FedDG papers, batched on the device.

The papers name the three operations but not their parameters; we use rotation within ±15°, isotropic scaling
in 0.9-1.1 (each applied with probability 0.5) and independent flips along both in-plane axes (probability 0.5
each). Both axes are flipped because the layouts do not share one in-plane orientation (NIfTI slices are
(x, y) after canonical reorientation, the PNG layouts are stored as displayed), so no axis is privileged.
Images are resampled bilinearly and labels by nearest neighbour, so labels stay binary and nested structures
(disc ⊇ cup) stay nested; the spatial size is kept. Outside-the-image pixels become 0, i.e. the mean intensity of
a z-scored MRI and mid-grey for fundus in [-1, 1].

Why batched, on the training device: the per-sample MONAI dictionary transforms we used before
(``RandRotated`` -> ``RandZoomd`` -> ``RandFlipd``) cost 8 ms a sample on one CPU thread, 3.6 s of a 13.6 s
round of a prostate site at 64 px on a 2-core machine (``python benchmarks/augmentation_time.py`` compares the two
side by side), and on a GPU host they ran on the training thread while the GPU waited. Here the flips are exact
index flips and rotation and scaling are one affine resampling of the whole batch (MONAI's ``AffineTransform``
layer, i.e. one ``grid_sample``) where the batch already is: a few milliseconds a round on a CPU, next to
nothing on a GPU, and no DataLoader workers to fork. Flipping first and then rotating/scaling gives the same
distribution of transforms as rotate -> zoom -> flip: a flip turns a rotation by a into one by -a (the range is
symmetric) and commutes with isotropic scaling. Rotation and scaling are composed into one resampling instead of
two, which blurs less.

The draws come from a CPU generator seeded per round (:func:`feddg.seeds.round_seed`), so a run is the same on
the CPU and on a GPU, whatever the batch's device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from monai.networks.layers import AffineTransform

ROTATION_DEGREES = 15.0
ROTATION_PROBABILITY = 0.5
ZOOM_RANGE = (0.9, 1.1)
ZOOM_PROBABILITY = 0.5
FLIP_PROBABILITY = 0.5


@dataclass(frozen=True)
class AugmentationDraw:
    """The random parameters of one batch of B samples.

    Attributes:
        flip_rows, flip_cols: (B,) bool, flip along the row (H) / column (W) axis.
        angle: (B,) float radians, 0 where the sample is not rotated.
        zoom: (B,) float scale factor (> 1 enlarges the content), 1 where the sample is not scaled.
    """

    flip_rows: torch.Tensor
    flip_cols: torch.Tensor
    angle: torch.Tensor
    zoom: torch.Tensor

    @property
    def resampled(self) -> torch.Tensor:
        """(B,) bool: the samples that need a resampling (rotated or scaled)."""
        return (self.angle != 0) | (self.zoom != 1)

    def theta(self) -> torch.Tensor:
        """(B, 2, 3) affine matrices in normalised (row, col) coordinates, mapping each output pixel to where it
        is sampled in the input: a rotation by ``angle`` and a scaling by ``1 / zoom``."""
        cos, sin = torch.cos(self.angle) / self.zoom, torch.sin(self.angle) / self.zoom
        zero = torch.zeros_like(cos)
        return torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], -2)


def draw(batch: int, generator: torch.Generator) -> AugmentationDraw:
    """The parameters of ``batch`` samples, drawn from ``generator`` (CPU), 6 uniform numbers per sample."""
    u = torch.rand(batch, 6, generator=generator, dtype=torch.float64)
    rotate, zoom = u[:, 0] < ROTATION_PROBABILITY, u[:, 2] < ZOOM_PROBABILITY
    angle = torch.where(rotate, (2 * u[:, 1] - 1) * math.radians(ROTATION_DEGREES), 0.0)
    lo, hi = ZOOM_RANGE
    scale = torch.where(zoom, lo + (hi - lo) * u[:, 3], 1.0)
    return AugmentationDraw(u[:, 4] < FLIP_PROBABILITY, u[:, 5] < FLIP_PROBABILITY, angle, scale)


def apply(image: torch.Tensor, label: torch.Tensor, d: AugmentationDraw) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the draw ``d`` to a batch: image (B, C, H, W) float, label (B, L, H, W) float in {0, 1}.

    Returns new tensors of the same shapes, dtypes and device."""
    image, label = image.clone(), label.clone()
    for mask, dim in ((d.flip_rows, -2), (d.flip_cols, -1)):
        rows = mask.nonzero().flatten().to(image.device)
        if len(rows):
            image[rows] = image[rows].flip(dim)
            label[rows] = label[rows].flip(dim)
    rows = d.resampled.nonzero().flatten()
    if len(rows):
        theta = d.theta()[rows].to(device=image.device, dtype=torch.float32)
        rows = rows.to(image.device)
        image[rows] = _resample(image[rows], theta, "bilinear")
        label[rows] = _resample(label[rows], theta, "nearest")
    return image, label


def _resample(x: torch.Tensor, theta: torch.Tensor, mode: str) -> torch.Tensor:
    warp = AffineTransform(normalized=True, mode=mode, padding_mode="zeros", align_corners=False,
                           reverse_indexing=True)
    return warp(x.float(), theta).to(x.dtype)


class BatchAugmentation:
    """The training augmentation of one round: call it on each batch in order.

    Args:
        seed: the round's seed; the same seed gives the same transforms for the same sequence of batch sizes.
    """

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, image: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W), (B, L, H, W) -> the augmented pair, on the tensors' device."""
        return apply(image, label, draw(image.shape[0], self.generator))
