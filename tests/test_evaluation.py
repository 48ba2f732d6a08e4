"""The rounds' cheap validation gives the same Dice and loss as the full evaluation, volumes and images alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from feddg.data.dataset import SliceSet
from feddg.evaluation import evaluate_sliceset, mean_dice, validation_scores
from feddg.nets.unet import FedDGUNet


def _slices(volumes: bool, n_labels: int) -> SliceSet:
    rng = np.random.default_rng(0)
    n = 6
    images = rng.normal(size=(n, 1, 32, 32)).astype(np.float32)
    yy, xx = np.mgrid[:32, :32]
    labels = np.stack([np.stack([np.hypot(yy - 16, xx - 16) < r + i for r in (9, 4)[:n_labels]]) for i in range(n)])
    cases = ["a"] * 3 + ["b"] * 3 if volumes else [f"c{i}" for i in range(n)]
    spacing = {"a": (1.0, 1.0, 3.0), "b": (0.8, 0.8, 2.5)} if volumes else None
    return SliceSet("S", images, labels.astype(np.uint8), cases, np.array([0, 1, 2, 0, 1, 2]), spacing)


@pytest.mark.parametrize("volumes, names", [(True, ["prostate"]), (False, ["disc", "cup"])])
def test_validation_scores_equal_the_full_evaluation(volumes, names):
    torch.manual_seed(0)
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4), out_channels=len(names))
    s = _slices(volumes, len(names))
    full = evaluate_sliceset(model, s, names, torch.device("cpu"), 4)["summary"]
    quick = validation_scores(model, s, names, torch.device("cpu"), 4)
    assert quick["dice"] == pytest.approx(mean_dice(full, names), abs=1e-12)
    assert quick["loss"] == pytest.approx(full["loss"], abs=1e-12)


def test_validation_of_an_empty_split_is_refused():
    s = SliceSet.empty("S", 1, 1, 32, volumes=True)
    with pytest.raises(ValueError, match="site S: nothing to validate"):
        validation_scores(FedDGUNet(features=(4, 4, 8, 8, 8, 4)), s, ["prostate"], torch.device("cpu"))
