"""Eq. (4) of MLA-BIN: combining the sites' state dicts with the attention weights, and refusing what cannot be
combined."""

from __future__ import annotations

import pytest
import torch

from feddg.methods.mla.combination import combine_state_dicts
from feddg.nets.unet import FedDGUNet
from tests.conftest import TINY_MODEL

FEATURES = tuple(TINY_MODEL["features"])


def _models(n: int = 3) -> list[dict[str, torch.Tensor]]:
    """n tiny U-Nets with different weights and BatchNorm statistics (non-trivial buffers)."""
    states = []
    for i in range(n):
        torch.manual_seed(100 + i)
        m = FedDGUNet(features=FEATURES)
        m.train()
        m(torch.randn(2, 1, 32, 32) * (i + 1))  # moves the running statistics, counts one batch
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        for k, v in sd.items():
            if k.endswith("num_batches_tracked"):
                v.fill_(10 * (i + 1))
        states.append(sd)
    return states


def test_combination_is_the_weighted_sum_of_the_state_dicts():
    states = _models()
    w = [0.2, 0.5, 0.3]
    out = combine_state_dicts(states, w)
    assert list(out) == list(states[0])
    for k, v in out.items():
        assert v.dtype == states[0][k].dtype and v.shape == states[0][k].shape
        if v.is_floating_point():
            manual = sum(wi * s[k].double() for wi, s in zip(w, states)).float()
            assert torch.equal(v, manual), k
    # integer counters: the same weighted sum, rounded (0.2 * 10 + 0.5 * 20 + 0.3 * 30 = 21)
    assert int(out["conv_0.conv_0.adn.N.num_batches_tracked"]) == 21
    assert out["conv_0.conv_0.adn.N.num_batches_tracked"].dtype == torch.int64
    # new tensors: changing the result leaves the inputs alone
    key = "final_conv.weight"
    before = states[0][key].clone()
    out[key].add_(1.0)
    assert torch.equal(states[0][key], before)


def test_weights_may_be_a_tensor_and_a_loaded_model_runs():
    states = _models()
    out = combine_state_dicts(states, torch.tensor([1 / 3, 1 / 3, 1 / 3]))
    model = FedDGUNet(features=FEATURES)
    model.load_state_dict(out)
    assert model.eval()(torch.randn(1, 1, 32, 32)).shape == (1, 1, 32, 32)


@pytest.mark.parametrize("site", [0, 1, 2])
def test_one_hot_weights_return_exactly_that_model(site):
    states = _models()
    other = (site + 1) % 3
    states[other]["final_conv.weight"][0, 0, 0, 0] = float("nan")  # a zero-weight model cannot leak in
    w = [0.0, 0.0, 0.0]
    w[site] = 1.0
    out = combine_state_dicts(states, w)
    assert all(torch.equal(out[k], states[site][k]) for k in out)


def test_disagreeing_keys_name_the_key_and_both_models():
    states = _models()
    states[2]["extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"'extra\.weight' is in model 2 \(C\) but not in model 0 \(A\)"):
        combine_state_dicts(states, [0.2, 0.5, 0.3], labels=["A", "B", "C"])
    states = _models()
    del states[1]["final_conv.bias"]
    with pytest.raises(ValueError, match=r"keys: 'final_conv\.bias' is in model 0 but not in model 1"):
        combine_state_dicts(states, [0.2, 0.5, 0.3])


def test_disagreeing_shapes_name_the_key_and_both_shapes():
    states = _models()
    states[1]["final_conv.weight"] = torch.zeros(2, 8, 1, 1)
    with pytest.raises(ValueError, match=r"shapes: 'final_conv\.weight' is \(1, 8, 1, 1\) in model 0 but "
                                         r"\(2, 8, 1, 1\) in model 1"):
        combine_state_dicts(states, [0.2, 0.5, 0.3])


@pytest.mark.parametrize(
    "weights, message",
    [
        ([0.5, 0.5], r"expected 3 weights \(one per model\), got shape \(2,\)"),
        ([0.6, -0.1, 0.5], "non-negative"),
        ([0.5, float("nan"), 0.5], "finite"),
        ([0.5, float("inf"), 0.5], "finite"),
        ([0.3, 0.3, 0.3], "sum to 1"),
        ([[0.2, 0.5, 0.3]], "expected 3 weights"),
    ],
)
def test_bad_weights_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        combine_state_dicts(_models(), weights)


def test_no_models_is_an_error():
    with pytest.raises(ValueError, match="no state dicts"):
        combine_state_dicts([], [])
