"""Training augmentation: random rotation, scaling and flipping, as in the FedDG papers.

The papers name the three operations but not their parameters; we use rotation within ±15°, isotropic scaling
in 0.9–1.1 (each applied with probability 0.5) and independent flips along both in-plane axes (probability 0.5
each). Both axes are flipped because the layouts do not share one in-plane orientation (NIfTI slices are
(x, y) after canonical reorientation, the PNG layouts are stored as displayed), so no axis is privileged.
Images use bilinear interpolation and labels nearest neighbour, so labels stay binary; the spatial size is kept.
Outside-the-image pixels become 0, i.e. the mean intensity of a z-scored MRI and mid-grey for fundus in [-1, 1].
"""

from __future__ import annotations

import math

from monai.transforms import Compose, RandFlipd, RandRotated, RandZoomd

KEYS = ("image", "label")


def train_augmentation(seed: int) -> Compose:
    """Per-sample augmentation of {"image": (C, H, W), "label": (L, H, W)} float arrays, seeded by ``seed``."""
    t = Compose(
        [
            RandRotated(
                KEYS, range_x=math.radians(15), prob=0.5, keep_size=True,
                mode=("bilinear", "nearest"), padding_mode="zeros",
            ),
            RandZoomd(
                KEYS, min_zoom=0.9, max_zoom=1.1, prob=0.5, keep_size=True,
                mode=("bilinear", "nearest-exact"), padding_mode="constant",
            ),
            RandFlipd(KEYS, prob=0.5, spatial_axis=0),
            RandFlipd(KEYS, prob=0.5, spatial_axis=1),
        ]
    )
    t.set_random_state(seed=seed)
    return t
