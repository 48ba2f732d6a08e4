"""The local training loop: Dice loss, FedProx's proximal term, divergence detection."""

import copy

import pytest
import torch

from feddg.nets.unet import FedDGUNet
from feddg.training import train_epochs


def _batches(n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"image": torch.randn(2, 1, 32, 32, generator=g),
             "label": (torch.rand(2, 1, 32, 32, generator=g) > 0.7).float()} for _ in range(n)]


def _run(mu, global_model=None, lr=1e-2):
    torch.manual_seed(0)
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
    start = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    result = train_epochs(model, _batches(), opt, 1, torch.device("cpu"), mu, global_model or start)
    return model, start, result


def _distance(a, b):
    return sum(((p - q) ** 2).sum() for p, q in zip(a.parameters(), b.parameters())).item()


def test_training_moves_the_weights_and_counts_steps():
    model, start, result = _run(0.0)
    assert result.steps == 2 and 0 < result.mean_loss < 1
    assert _distance(model, start) > 0


def test_fedprox_term_pulls_towards_the_global_model():
    plain, start, _ = _run(0.0)
    prox, start2, _ = _run(10.0)
    assert _distance(prox, start2) < _distance(plain, start)


def test_fedprox_needs_the_global_model():
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
    with pytest.raises(ValueError, match="global model"):
        train_epochs(model, _batches(), torch.optim.SGD(model.parameters(), lr=0.1), 1, torch.device("cpu"), 1.0, None)


def test_non_finite_loss_stops_training():
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
    batches = _batches()
    batches[0]["image"][0, 0, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError):
        train_epochs(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), 1, torch.device("cpu"))


def test_local_steps_train_exactly_that_many_steps_across_epochs():
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
    result = train_epochs(model, _batches(2), torch.optim.SGD(model.parameters(), lr=0.01), 1,
                          torch.device("cpu"), max_steps=5)
    assert result.steps == 5
    assert train_epochs(model, [], torch.optim.SGD(model.parameters(), lr=0.01), 1, torch.device("cpu"),
                        max_steps=3).steps == 0
