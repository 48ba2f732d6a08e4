"""The training augmentation: keeps shapes, keeps labels binary, is seeded."""

from __future__ import annotations

import numpy as np
import torch

from feddg.data.transforms import train_augmentation


def _sample(c: int = 3, n_labels: int = 2, size: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:size, :size]
    r = np.hypot(yy - size / 3, xx - size / 2)
    label = np.stack([r < 9, r < 4][:n_labels]).astype(np.float32)
    return {"image": rng.normal(size=(c, size, size)).astype(np.float32), "label": label}


def _run(seed: int, n: int = 12) -> list[dict[str, torch.Tensor]]:
    t = train_augmentation(seed)
    return [{k: torch.as_tensor(v) for k, v in t(_sample()).items()} for _ in range(n)]


def test_shapes_kept_and_labels_binary():
    for out in _run(0):
        assert out["image"].shape == (3, 32, 32) and out["label"].shape == (2, 32, 32)
        assert set(out["label"].unique().tolist()) <= {0.0, 1.0}
        assert (out["label"][1] <= out["label"][0]).all()  # nearest keeps nested structures nested


def test_deterministic_per_seed_and_actually_random():
    a, b, c = _run(5), _run(5), _run(6)
    assert all(torch.equal(x["image"], y["image"]) and torch.equal(x["label"], y["label"]) for x, y in zip(a, b))
    assert any(not torch.equal(x["image"], y["image"]) for x, y in zip(a, c))
    original = torch.as_tensor(_sample()["image"])
    changed = sum(not torch.equal(x["image"], original) for x in a)
    assert changed >= 6, "most samples should be transformed"
    assert len({x["image"].sum().item() for x in a}) > 3


def test_single_channel_prostate_sample():
    t = train_augmentation(1)
    for _ in range(5):
        out = t(_sample(c=1, n_labels=1))
        assert tuple(out["image"].shape) == (1, 32, 32) and tuple(out["label"].shape) == (1, 32, 32)
        assert set(np.unique(np.asarray(out["label"])).tolist()) <= {0.0, 1.0}
