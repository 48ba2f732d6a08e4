"""Eq. (5)-(7) of ELCFS against hand-worked values."""

import itertools
import math

import pytest
import torch

from feddg.methods.boundary import boundary_info_nce, boundary_loss, boundary_masks, masked_average_pool


def _square(size: int, lo: int, hi: int) -> torch.Tensor:
    y = torch.zeros(1, 1, size, size)
    y[..., lo:hi, lo:hi] = 1
    return y


def test_boundary_is_the_label_minus_its_erosion_and_the_ring_its_dilation_minus_the_label():
    y = _square(21, 8, 13)  # a 5 x 5 square in the middle
    bd, bg = boundary_masks(y, dilation_iterations=1)
    assert bd.sum() == 5 * 5 - 3 * 3  # the outer one-pixel frame of the square
    assert bg.sum() == 7 * 7 - 5 * 5  # a one-pixel ring around it (3 x 3 square element)
    _, bg5 = boundary_masks(y, dilation_iterations=5)
    assert bg5.sum() == 15 * 15 - 5 * 5  # five iterations: a five-pixel ring
    assert (bd * (1 - y)).sum() == 0 and (bg5 * y).sum() == 0  # boundary inside, ring outside


def test_structures_are_processed_separately():
    y = torch.zeros(2, 2, 16, 16)
    y[0, 0, 4:12, 4:12] = 1  # image 0: disc 8 x 8; its cup and all of image 1 empty
    bd, bg = boundary_masks(y, dilation_iterations=1)
    assert bd.sum(dim=(-2, -1)).tolist() == [[64 - 36, 0], [0, 0]]
    assert bg.sum(dim=(-2, -1)).tolist() == [[100 - 64, 0], [0, 0]]


def test_masked_average_pool_is_eq5():
    z = torch.arange(2 * 2 * 2, dtype=torch.float32).reshape(1, 2, 2, 2)  # channel 0: 0..3, channel 1: 4..7
    mask = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # pixels 0 and 3
    torch.testing.assert_close(masked_average_pool(z, mask), torch.tensor([[[1.5, 5.5]]]))
    assert torch.equal(masked_average_pool(z, torch.zeros(1, 1, 2, 2)), torch.zeros(1, 1, 2))


def test_info_nce_closed_form():
    # V = 2: boundary features (1, 0), background (0, 1). Positive pairs have cosine 1, negatives 0:
    # l = -log(exp(1/tau) / (exp(0) + exp(0))) = log 2 - 1/tau for both positive pairs.
    h_bd = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]])
    h_bg = torch.tensor([[[0.0, 1.0], [0.0, 3.0]]])
    loss = boundary_info_nce(h_bd, h_bg, tau=0.05)
    torch.testing.assert_close(loss, torch.tensor([math.log(2) - 20.0]))


def test_info_nce_closed_form_with_the_all_others_denominator():
    # Same features: the denominator adds the positive, exp(1/tau) + 2: l = log(1 + 2 exp(-1/tau)) >= 0.
    h_bd = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]], dtype=torch.float64)
    h_bg = torch.tensor([[[0.0, 1.0], [0.0, 3.0]]], dtype=torch.float64)
    loss = boundary_info_nce(h_bd, h_bg, tau=0.05, denominator="all")
    torch.testing.assert_close(loss, torch.tensor([math.log1p(2 * math.exp(-20.0))], dtype=torch.float64))
    with pytest.raises(ValueError, match="denominator"):
        boundary_info_nce(h_bd, h_bg, denominator="positives")


def _reference(h_bd: torch.Tensor, h_bg: torch.Tensor, tau: float, denominator: str = "negatives") -> float:
    """Eq. (6)-(7) written out with loops, for one group."""
    h = [*h_bd, *h_bg]
    cls = [0] * len(h_bd) + [1] * len(h_bg)
    cos = lambda a, b: float(a @ b / (a.norm() * b.norm()))  # noqa: E731
    k = len(h_bd)
    total = 0.0
    for m, p in itertools.combinations(range(2 * k), 2):
        if cls[m] != cls[p]:
            continue
        others = [q for q in range(2 * k) if q != m and (denominator == "all" or cls[q] != cls[m])]
        denom = sum(math.exp(cos(h[m], h[q]) / tau) for q in others)
        total += -math.log(math.exp(cos(h[m], h[p]) / tau) / denom)
    return total / (math.comb(k, 2) * 2)


@pytest.mark.parametrize("views", [2, 3, 5])
def test_info_nce_matches_the_equation_written_out(views):
    g = torch.Generator().manual_seed(views)
    h_bd, h_bg = torch.randn(2, views, 6, generator=g, dtype=torch.float64).unbind(0)
    for tau in (0.05, 0.5):
        for denominator in ("negatives", "all"):
            got = boundary_info_nce(h_bd[None], h_bg[None], tau, denominator)
            assert float(got) == pytest.approx(_reference(h_bd, h_bg, tau, denominator), rel=1e-9)


def test_slices_without_foreground_are_skipped_never_nan():
    feats = [torch.randn(4, 3, 8, 8, requires_grad=True), torch.randn(4, 2, 16, 16, requires_grad=True)]
    empty = torch.zeros(2, 1, 16, 16)
    loss = boundary_loss(feats, empty, views=2)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert all(torch.isfinite(f.grad).all() and f.grad.abs().sum() == 0 for f in feats)


def test_per_structure_and_per_image_average_over_valid_groups_only():
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(2 * 2, 4, 16, 16, generator=g)]  # B = 2 images, V = 2 views
    labels = torch.zeros(2, 2, 16, 16)  # two structures (disc, cup)
    labels[0, 0, 4:12, 4:12] = 1  # image 0: disc only; image 1: nothing
    loss = boundary_loss(feats, labels, views=2, tau=0.1)
    bd, bg = boundary_masks(labels[0:1, 0:1])
    z = feats[0]
    h_bd = masked_average_pool(z[[0, 2]], bd.repeat(2, 1, 1, 1))[:, 0]
    h_bg = masked_average_pool(z[[0, 2]], bg.repeat(2, 1, 1, 1))[:, 0]
    torch.testing.assert_close(loss, boundary_info_nce(h_bd[None], h_bg[None], 0.1)[0])


def test_features_are_resized_to_the_label_size():
    feats = [torch.randn(2, 3, 8, 8, requires_grad=True), torch.randn(2, 2, 16, 16, requires_grad=True)]
    labels = _square(16, 4, 12)
    loss = boundary_loss(feats, labels, views=2)
    loss.backward()
    assert torch.isfinite(loss) and feats[0].grad.abs().sum() > 0 and feats[1].grad.abs().sum() > 0
    with pytest.raises(ValueError, match="2 views of 1 images"):
        boundary_loss([torch.randn(3, 2, 16, 16)], labels, views=2)
