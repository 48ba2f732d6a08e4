"""Eq. (1)-(3) of ELCFS against hand-worked values, and the degeneration the issue warns about."""

import numpy as np
import pytest
import torch

from feddg.config import config_from_dict
from feddg.data.dataset import load_site
from feddg.methods.frequency import (
    amplitude_window,
    exposure_ratio,
    interpolate_amplitude,
    sample_transfers,
    window_half_widths,
    window_slices,
)
from tests.conftest import tiny_experiment


def test_half_widths_follow_floor_alpha_h_with_a_floor():
    assert window_half_widths(384, 384, 0.01) == (3, 3)  # the paper: a 7 x 7 window at 384 px
    assert window_half_widths(300, 200, 0.01, 0) == (3, 2)
    assert window_half_widths(64, 64, 0.01, 0) == (0, 0)  # below 100 px: the DC coefficient alone
    assert window_half_widths(64, 64, 0.01) == (1, 1)  # the default floor keeps a 3 x 3 window
    assert window_half_widths(64, 64, 0.05) == (3, 3)


def test_an_image_smaller_than_the_window_is_an_error_naming_both_sizes():
    with pytest.raises(ValueError, match=r"2x2 px is smaller than the amplitude window 3x3"):
        window_half_widths(2, 2, 0.01, 1)
    with pytest.raises(ValueError, match="smaller than the amplitude window"):
        amplitude_window(np.zeros((1, 1, 2, 2)), (1, 1))
    with pytest.raises(ValueError, match="smaller than the amplitude window"):
        interpolate_amplitude(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 3, 3), torch.zeros(1))


def test_exposure_ratio_of_the_window_design():
    assert exposure_ratio(384, 384, (3, 3)) == pytest.approx(384 * 384 / 49)  # ~3,009x fewer values
    assert exposure_ratio(64, 64, (1, 1)) == pytest.approx(4096 / 9)  # ~455x at the CPU default


def test_window_is_centred_on_the_zero_frequency():
    rows, cols = window_slices(8, 6, (1, 2))
    assert (rows.start, rows.stop, cols.start, cols.stop) == (3, 6, 1, 6)
    # A constant image has all its energy at DC: the window's centre holds H*W*c, the rest is zero.
    win = amplitude_window(np.full((1, 1, 8, 6), 2.0), (1, 2))
    assert win.shape == (1, 1, 3, 5) and win.dtype == np.float32
    expected = np.zeros((3, 5), np.float32)
    expected[1, 2] = 8 * 6 * 2.0
    np.testing.assert_allclose(win[0, 0], expected, atol=1e-4)


def test_window_is_per_channel_and_non_negative():
    rng = np.random.default_rng(0)
    rgb = rng.normal(size=(2, 3, 16, 16))
    win = amplitude_window(rgb, (1, 1))
    assert win.shape == (2, 3, 3, 3) and (win >= 0).all()
    np.testing.assert_allclose(win[1, 2], amplitude_window(rgb[1:2, 2:3], (1, 1))[0, 0], rtol=1e-6)


def test_hand_worked_dc_interpolation_keeps_the_local_sign():
    # x = -1 everywhere on 4x4: DC = -16 (|DC| = 16, phase pi), nothing else. Other site's |DC| = 48.
    # lambda = 0.5 -> |DC| = 0.5 * 16 + 0.5 * 48 = 32 with the local phase -> DC = -32 -> x' = -2 everywhere.
    x = torch.full((1, 1, 4, 4), -1.0)
    other = torch.zeros(1, 1, 3, 3)
    other[0, 0, 1, 1] = 48.0
    out = interpolate_amplitude(x, other, torch.tensor([0.5]))
    torch.testing.assert_close(out, torch.full_like(x, -2.0), atol=1e-5, rtol=0)


def test_lambda_zero_returns_the_input_and_lambda_one_imposes_the_other_window():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 32, 32, generator=g, dtype=torch.float64)
    other_images = torch.rand(3, 3, 32, 32, generator=g, dtype=torch.float64) * 5
    other = torch.as_tensor(amplitude_window(other_images.numpy(), (2, 1)), dtype=torch.float64)
    torch.testing.assert_close(interpolate_amplitude(x, other, torch.zeros(3)), x)
    out = interpolate_amplitude(x, other, torch.ones(3))
    np.testing.assert_allclose(amplitude_window(out.numpy(), (2, 1)), other.numpy(), rtol=1e-4, atol=1e-3)


def test_phase_outside_and_inside_the_window_is_unchanged_and_outside_amplitude_too():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64) + 3.0
    other = torch.rand(2, 1, 3, 3, generator=g, dtype=torch.float64) * 100
    lam = torch.tensor([0.3, 0.8], dtype=torch.float64)
    out = interpolate_amplitude(x, other, lam)
    fx = torch.fft.fftshift(torch.fft.fft2(x), dim=(-2, -1))
    fo = torch.fft.fftshift(torch.fft.fft2(out), dim=(-2, -1))
    torch.testing.assert_close(torch.polar(torch.ones_like(fo.abs()), fo.angle()),
                               torch.polar(torch.ones_like(fx.abs()), fx.angle()), atol=1e-8, rtol=0)
    rows, cols = window_slices(16, 16, (1, 1))
    outside = torch.ones(16, 16, dtype=torch.bool)
    outside[rows, cols] = False
    torch.testing.assert_close(fo.abs()[..., outside], fx.abs()[..., outside])
    # DC magnitude (centre of the window): (1 - lambda) |DC_local| + lambda |DC_other|.
    expected = (1 - lam) * fx.abs()[:, 0, 8, 8] + lam * other[:, 0, 1, 1]
    torch.testing.assert_close(fo.abs()[:, 0, 8, 8], expected)
    assert torch.equal(torch.sign(out.sum(dim=(1, 2, 3))), torch.sign(x.sum(dim=(1, 2, 3))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtypes_are_preserved(dtype):
    x = torch.randn(4, 3, 32, 32, dtype=dtype)
    out = interpolate_amplitude(x, torch.rand(4, 3, 3, 3), torch.rand(4))
    assert out.shape == x.shape and out.dtype == dtype


def test_sample_transfers_draws_distinct_other_sites():
    g = torch.Generator().manual_seed(0)
    picks, lam = sample_transfers({"A": 5, "B": 3, "C": 2, "D": 0}, "A", 6, None, (0.0, 1.0), g)
    assert lam.shape == (6, 2) and (lam >= 0).all() and (lam <= 1).all()
    for row in picks:
        assert sorted(s for s, _ in row) == ["B", "C"]  # K - 1 = all other non-empty sites, no repeats
        assert all(0 <= j < {"B": 3, "C": 2}[s] for s, j in row)
    picks, lam = sample_transfers({"A": 5, "B": 3, "C": 2}, "A", 4, 1, (0.2, 0.4), g)
    assert lam.shape == (4, 1) and (lam >= 0.2).all() and (lam <= 0.4).all()
    with pytest.raises(ValueError, match="between 1 and 2"):
        sample_transfers({"A": 5, "B": 3, "C": 2}, "A", 4, 3, (0.0, 1.0), g)
    with pytest.raises(ValueError, match="no other site"):
        sample_transfers({"A": 5}, "A", 4, None, (0.0, 1.0), g)


def _site_images(root, site: str, zscore: str) -> np.ndarray:
    exp = tiny_experiment("prostate", str(root))
    exp["data"]["zscore"] = zscore
    return load_site(config_from_dict(exp).data, site)["train"].images


@pytest.mark.parametrize("zscore", ["volume", "slice"])
def test_after_preprocessing_the_transform_changes_what_the_network_sees(synthetic_root, zscore):
    """The issue's degeneration check: on z-scored network inputs, the change grows with lambda and is
    measurable with the default 3 x 3 window; with a DC-only window on slice-z-scored images it vanishes."""
    local = _site_images(synthetic_root["prostate"], "BIDMC", zscore)
    remote = _site_images(synthetic_root["prostate"], "I2CVB", zscore)
    n = min(len(local), len(remote), 8)
    local, remote = torch.as_tensor(local[:n]), remote[:n]
    hw = window_half_widths(local.shape[-2], local.shape[-1], alpha=0.01)  # 32 px: floored to (1, 1)
    other = torch.as_tensor(amplitude_window(remote, hw))
    changes = [float((interpolate_amplitude(local, other, torch.full((n,), lam)) - local).abs().mean())
               for lam in (0.25, 0.5, 1.0)]
    assert changes[0] < changes[1] < changes[2]
    assert changes[2] > 0.05  # in units of the image's standard deviation
    dc_only = torch.as_tensor(amplitude_window(remote, (0, 0)))
    dc_change = float((interpolate_amplitude(local, dc_only, torch.ones(n)) - local).abs().mean())
    if zscore == "slice":
        assert dc_change < 1e-3 < changes[2]  # zero-mean slices: swapping the DC does nothing
