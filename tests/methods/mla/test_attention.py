"""The domain attention module of MLA-BIN (Eq. 3), its training (Eq. 8) and its weights for an unseen domain."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from feddg.methods.mla.attention import DomainAttention, attention_weights, train_domain_attention
from feddg.methods.mla.combination import check_weights


def test_domain_attention_layers_and_shapes():
    m = DomainAttention(in_features=20, num_sites=4)
    assert isinstance(m.conv, nn.Conv2d) and m.conv.kernel_size == (1, 1)
    assert (m.conv.in_channels, m.conv.out_channels, m.fc1.out_features, m.fc2.out_features) == (20, 128, 64, 4)
    x = torch.randn(5, 20)
    assert m(x).shape == (5, 4)
    assert torch.equal(m(x), m(x[:, :, None, None]))  # (B, C) is treated as (B, C, 1, 1)
    torch.testing.assert_close(m.probabilities(x).sum(dim=1), torch.ones(5))
    with pytest.raises(ValueError, match=r"\(B, 20\)"):
        m(torch.randn(5, 19))


def test_domain_attention_init_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b, c = DomainAttention(8, 3, seed=5), DomainAttention(8, 3, seed=5), DomainAttention(8, 3, seed=6)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.fc1.weight, c.fc1.weight)


def _toy_bank(rng: np.random.Generator, n: int = 30, width: int = 16) -> dict[str, np.ndarray]:
    """Three sites whose features are Gaussian clouds around well-separated centres, on a large common offset and
    scale (like raw encoder features)."""
    centres = rng.normal(0, 1, (3, width)) * 4
    return {s: (100 + 10 * (centres[i] + rng.normal(0, 1, (n, width)))).astype(np.float32)
            for i, s in enumerate(["A", "B", "C"])}


def test_training_on_separable_features_reaches_high_accuracy_and_generalizes():
    rng = np.random.default_rng(0)
    bank = _toy_bank(rng)
    module, order, accuracy = train_domain_attention(bank, epochs=30, seed=0)
    assert order == ["A", "B", "C"] and module.num_sites == 3 and not module.training
    assert accuracy >= 0.95
    # fresh points from B's cloud: weights concentrate on B
    rng2 = np.random.default_rng(0)
    fresh = _toy_bank(rng2, n=60)["B"][30:]
    w = attention_weights(module, fresh)
    assert w.shape == (3,) and int(w.argmax()) == 1 and float(w[1]) > 0.9


def test_the_bank_standardizes_the_input_unless_turned_off():
    bank = _toy_bank(np.random.default_rng(0), n=10)
    x = np.concatenate(list(bank.values()))
    on, _, _ = train_domain_attention(bank, epochs=1, seed=0)
    assert np.allclose(on.feature_mean.numpy(), x.mean(axis=0), rtol=1e-5)
    assert np.allclose(on.feature_std.numpy(), x.std(axis=0), rtol=1e-4)
    off, _, _ = train_domain_attention(bank, epochs=1, seed=0, standardize=False)  # Eq. (3) as printed
    assert torch.equal(off.feature_mean, torch.zeros(16)) and torch.equal(off.feature_std, torch.ones(16))
    assert not torch.equal(on.fc2.weight, off.fc2.weight)


def test_training_is_deterministic_and_seed_dependent():
    bank = _toy_bank(np.random.default_rng(1), n=10)
    threads = torch.get_num_threads()
    a, _, acc_a = train_domain_attention(bank, epochs=5, seed=3)
    assert torch.get_num_threads() == threads  # trains on one thread, then restores the count
    b, _, acc_b = train_domain_attention(bank, epochs=5, seed=3)
    c, _, _ = train_domain_attention(bank, epochs=5, seed=4)
    assert acc_a == acc_b
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.fc2.weight, c.fc2.weight)


def test_sites_without_vectors_are_left_out_with_a_warning():
    bank = _toy_bank(np.random.default_rng(2), n=10)
    bank = {"A": bank["A"], "EMPTY": np.zeros((0, 16), np.float32), "C": bank["C"]}
    with pytest.warns(UserWarning, match="EMPTY"):
        module, order, _ = train_domain_attention(bank, epochs=2)
    assert order == ["A", "C"] and module.num_sites == 2
    with pytest.raises(ValueError, match="no site has any feature vectors"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_domain_attention({"A": np.zeros((0, 4), np.float32)})


def test_a_bad_site_matrix_names_the_site():
    bank = _toy_bank(np.random.default_rng(3), n=4)
    bank["B"] = bank["B"].copy()
    bank["B"][2, 5] = np.nan
    with pytest.raises(ValueError, match="site 'B': .*NaN/Inf .* first in row 2"):
        train_domain_attention(bank, epochs=1)
    bank = _toy_bank(np.random.default_rng(3), n=4)
    bank["C"] = bank["C"][:, :8]
    with pytest.raises(ValueError, match="site 'C': .*expected 16 features"):
        train_domain_attention(bank, epochs=1)


def test_mean_mode_is_the_mean_of_the_per_image_softmax():
    torch.manual_seed(0)
    m = DomainAttention(6, 3, seed=1)
    x = torch.randn(7, 6)
    per_image = attention_weights(m, x, mode="per_image")
    assert per_image.shape == (7, 3) and per_image.dtype == torch.float64
    torch.testing.assert_close(per_image.sum(dim=1), torch.ones(7, dtype=torch.float64))
    mean = attention_weights(m, x)
    torch.testing.assert_close(mean, per_image.mean(dim=0))
    torch.testing.assert_close(mean, torch.softmax(m(x).double(), dim=1).mean(dim=0))
    assert not torch.allclose(mean, torch.softmax(m(x.mean(dim=0, keepdim=True)).double(), dim=1)[0])
    check_weights(mean, 3)  # the weights pass the combination's checks
    with pytest.raises(ValueError, match="mode"):
        attention_weights(m, x, mode="median")
    with pytest.raises(ValueError, match="at least one image"):
        attention_weights(m, x[:0])
    with pytest.raises(ValueError, match=r"\(N, 6\)"):
        attention_weights(m, x[:, :5])
