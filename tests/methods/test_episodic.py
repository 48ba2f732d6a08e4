"""Eq. (4), (8), (9) of ELCFS: the episodic step's gradient against an explicit computation on a tiny model."""

import pytest
import torch

from feddg.methods.boundary import boundary_loss
from feddg.methods.episodic import episodic_step, train_episodic, transformed_views
from feddg.nets.unet import FedDGUNet
from feddg.training import segmentation_loss


class Tiny(torch.nn.Module):
    """1x1 conv -> tanh -> 1x1 conv; the hidden activation is the 'decoder feature'."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(3, 2, 1, 1, generator=g, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.randn(1, 3, 1, 1, generator=g, dtype=torch.float64))

    def forward_with_features(self, x):
        h = torch.tanh(torch.nn.functional.conv2d(x, self.a))
        return torch.nn.functional.conv2d(h, self.b), [h]

    def forward(self, x):
        return self.forward_with_features(x)[0]


def seg(logits, y):
    return ((torch.sigmoid(logits) - y) ** 2).mean()


def feature_term(features, y, views):
    return (features[0] ** 2).mean() * y.mean()


def _inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, 4, 4, generator=g, dtype=torch.float64)
    y = (torch.rand(2, 1, 4, 4, generator=g) > 0.5).double()
    t = torch.randn(4, 2, 4, 4, generator=g, dtype=torch.float64)  # two views
    return x, y, t


def _fwd(model, p, x):
    h = torch.tanh(torch.nn.functional.conv2d(x, p["a"]))
    return torch.nn.functional.conv2d(h, p["b"]), [h]


@pytest.mark.parametrize("second_order", [False, True])
def test_episodic_gradient_matches_explicit_computation(second_order):
    beta, gamma = 0.1, 0.7  # large beta so that the second-order term is visible
    x, y, t = _inputs()
    model = Tiny()
    losses = episodic_step(model, x, y, t, seg, feature_term, beta, gamma, second_order)
    got = [model.a.grad.clone(), model.b.grad.clone()]

    theta = [model.a.detach().clone().requires_grad_(), model.b.detach().clone().requires_grad_()]

    def inner(a, b):
        return seg(_fwd(model, {"a": a, "b": b}, x)[0], y)

    def meta(a, b):
        logits, feats = _fwd(model, {"a": a, "b": b}, torch.cat([x, t]))
        return seg(logits[2:], y.repeat(2, 1, 1, 1)) + gamma * feature_term(feats, y, 3)

    g = torch.autograd.grad(inner(*theta), theta)
    fast = [(p - beta * gi).detach().requires_grad_() for p, gi in zip(theta, g)]
    h = torch.autograd.grad(meta(*fast), fast)  # gradient of L_meta at theta'
    if second_order:
        # d theta'/d theta = I - beta * Hessian(L_inner): apply its transpose (the Hessian is symmetric) to h.
        _, hvp = torch.autograd.functional.hvp(inner, tuple(p.detach() for p in theta), h)
        expected = [gi + hi - beta * hv for gi, hi, hv in zip(g, h, hvp)]
    else:
        expected = [gi + hi for gi, hi in zip(g, h)]
    for e, a in zip(expected, got):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    assert losses.inner == pytest.approx(float(inner(*theta).detach()))
    # The two orders really differ (the test would not catch a missing second-order term otherwise).
    first = [gi + hi for gi, hi in zip(g, h)]
    assert second_order == any(not torch.allclose(f, a) for f, a in zip(first, got))


def test_episodic_step_on_the_unet_with_the_boundary_loss():
    torch.manual_seed(0)
    model = FedDGUNet(1, 1, (4, 4, 8, 8, 16, 4))
    x = torch.randn(2, 1, 32, 32)
    y = torch.zeros(2, 1, 32, 32)
    y[0, :, 8:20, 10:22] = 1  # image 1 has no foreground: its boundary term is skipped
    t = torch.randn(4, 1, 32, 32)
    losses = episodic_step(model, x, y, t, segmentation_loss(), boundary_loss, 1e-3, 0.5)
    assert all(map(lambda v: v == v, (losses.inner, losses.meta_seg, losses.boundary)))
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert losses.boundary != 0.0


def test_non_finite_losses_raise():
    model = Tiny()
    x, y, t = _inputs()
    with pytest.raises(FloatingPointError, match="not finite"):
        episodic_step(model, x * float("nan"), y, t, seg, feature_term)


def test_transformed_views_are_view_major_and_move_towards_the_bank():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1, 16, 16, generator=g)
    bank = {"A": torch.rand(4, 1, 3, 3), "B": torch.full((2, 1, 3, 3), 500.0), "C": torch.full((5, 1, 3, 3), 900.0)}
    t = transformed_views(x, bank, "A", None, (1.0, 1.0), g)  # lambda = 1: the window becomes B's or C's
    assert t.shape == (2 * 3, 1, 16, 16)
    dc = torch.fft.fft2(t).abs()[:, 0, 0, 0]
    assert sorted(dc[[0, 3]].round().tolist()) == [500.0, 900.0]  # image 0's two views: one per other site


def test_train_episodic_reduces_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    model = FedDGUNet(1, 1, (4, 4, 8, 8, 16, 4))
    x = torch.randn(4, 1, 32, 32)
    y = torch.zeros(4, 1, 32, 32)
    y[:, :, 8:24, 8:24] = 1
    x = x + 2 * y
    bank = {"A": torch.rand(3, 1, 3, 3) * 50, "B": torch.rand(3, 1, 3, 3) * 80}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = [{"image": x, "label": y}] * 15
    first = train_episodic(model, batches[:1], opt, torch.device("cpu"), bank, "A", segmentation_loss(),
                           boundary_loss, seed=0)
    rest = train_episodic(model, batches, opt, torch.device("cpu"), bank, "A", segmentation_loss(), boundary_loss,
                          seed=1)
    assert first.steps == 1 and rest.steps == 15
    assert rest.mean_loss < first.mean_loss
