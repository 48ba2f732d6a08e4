"""The batched training augmentation: exact flips, the affine convention on hand-worked cases, the draws'
distribution, binary and nested labels, seeding."""

from __future__ import annotations

import math

import pytest
import torch

from feddg.data.transforms import (
    FLIP_PROBABILITY,
    ROTATION_DEGREES,
    ROTATION_PROBABILITY,
    ZOOM_PROBABILITY,
    ZOOM_RANGE,
    AugmentationDraw,
    BatchAugmentation,
    apply,
    draw,
)


def _batch(b: int = 4, c: int = 3, n_labels: int = 2, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    r = torch.hypot(yy - size / 3, xx - size / 2)
    label = torch.stack([r < 9, r < 4][:n_labels]).float().expand(b, -1, -1, -1).contiguous()
    return torch.randn(b, c, size, size, generator=g), label


def _draw(b: int, *, flip_rows=False, flip_cols=False, angle=0.0, zoom=1.0) -> AugmentationDraw:
    full = lambda v, dtype: torch.full((b,), v, dtype=dtype)  # noqa: E731
    return AugmentationDraw(full(flip_rows, torch.bool), full(flip_cols, torch.bool),
                            full(angle, torch.float64), full(zoom, torch.float64))


def test_no_transform_is_the_identity_and_does_not_touch_the_input():
    image, label = _batch()
    before = image.clone()
    out_image, out_label = apply(image, label, _draw(4))
    assert torch.equal(out_image, image) and torch.equal(out_label, label)
    assert torch.equal(image, before)


@pytest.mark.parametrize("rows, cols, dims", [(True, False, [-2]), (False, True, [-1]), (True, True, [-2, -1])])
def test_flips_are_exact_index_flips(rows, cols, dims):
    image, label = _batch()
    out_image, out_label = apply(image, label, _draw(4, flip_rows=rows, flip_cols=cols))
    assert torch.equal(out_image, image.flip(dims)) and torch.equal(out_label, label.flip(dims))


def test_a_quarter_turn_moves_pixel_centres_onto_pixel_centres():
    # Hand-worked: with align_corners=False a rotation by 90 degrees about the image centre maps the pixel grid
    # onto itself, so the labels (nearest) equal numpy-style rot90 exactly, in one of the two directions.
    image, label = _batch(b=1, c=1)
    _, out = apply(image, label, _draw(1, angle=math.pi / 2))
    assert torch.equal(out, torch.rot90(label, 1, (-2, -1))) or torch.equal(out, torch.rot90(label, -1, (-2, -1)))


def test_zoom_two_doubles_a_centred_square():
    # Hand-worked: a centred 4 x 4 square of a 32 x 32 label becomes the centred 8 x 8 square at zoom 2.
    label = torch.zeros(1, 1, 32, 32)
    label[..., 14:18, 14:18] = 1
    expected = torch.zeros_like(label)
    expected[..., 12:20, 12:20] = 1
    _, out = apply(torch.zeros(1, 1, 32, 32), label, _draw(1, zoom=2.0))
    assert torch.equal(out, expected)


def test_shrinking_pads_with_zeros_and_keeps_the_size():
    image = torch.ones(1, 1, 32, 32)
    out, _ = apply(image, torch.zeros(1, 1, 32, 32), _draw(1, zoom=0.5))
    assert out.shape == image.shape
    assert out[..., 0, 0].item() == 0.0 and out[..., 16, 16].item() == pytest.approx(1.0)


def test_labels_stay_binary_and_nested_under_random_draws():
    image, label = _batch(b=16)
    augment = BatchAugmentation(0)
    for _ in range(5):
        out_image, out_label = augment(image, label)
        assert out_image.shape == image.shape and out_label.shape == label.shape
        assert set(out_label.unique().tolist()) <= {0.0, 1.0}
        assert (out_label[:, 1] <= out_label[:, 0]).all()  # cup inside disc


def test_draws_follow_the_stated_probabilities_and_ranges():
    d = draw(20000, torch.Generator().manual_seed(1))
    rotated, zoomed = d.angle != 0, d.zoom != 1
    for share, p in ((rotated, ROTATION_PROBABILITY), (zoomed, ZOOM_PROBABILITY), (d.flip_rows, FLIP_PROBABILITY),
                     (d.flip_cols, FLIP_PROBABILITY)):
        assert share.double().mean().item() == pytest.approx(p, abs=0.015)
    assert d.angle.abs().max().item() <= math.radians(ROTATION_DEGREES)
    assert d.angle[rotated].mean().item() == pytest.approx(0.0, abs=0.01)  # symmetric
    assert ZOOM_RANGE[0] <= d.zoom.min().item() and d.zoom.max().item() <= ZOOM_RANGE[1]
    # the four decisions are independent of each other
    both = (rotated & d.flip_rows).double().mean().item()
    assert both == pytest.approx(ROTATION_PROBABILITY * FLIP_PROBABILITY, abs=0.015)


def test_seeded_deterministic_and_random():
    image, label = _batch(b=12)

    def run(seed):
        augment = BatchAugmentation(seed)
        return [augment(image, label) for _ in range(3)]

    a, b, c = run(5), run(5), run(6)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert any(not torch.equal(x[0], y[0]) for x, y in zip(a, c))
    changed = sum(not torch.equal(a[0][0][i], image[i]) for i in range(12))
    assert changed >= 6, "most samples should be transformed"
    assert not torch.equal(a[0][0], a[1][0]), "each batch draws anew"
