"""Continuous frequency-space interpolation (CFSI), ELCFS (Liu et al., CVPR 2021), section 3.2, Eq. (1)-(3).

Pure functions; numpy for what a site extracts and sends, torch for what runs inside the training loop.

Eq. (1): F(x) = FFT2(x) per channel; A = |F(x)| the amplitude, P = angle(F(x)) the phase.
Eq. (2): A_new = ((1 - lambda) A_local + lambda A_other) * M + A_local * (1 - M)
Eq. (3): x_new = Re(IFFT2(A_new * exp(j P_local)))

M is the centred low-frequency window [-alpha H : alpha H, -alpha W : alpha W] of the fftshift-ed spectrum, i.e.
(2 b_h + 1) x (2 b_w + 1) coefficients with b_h = floor(alpha H), b_w = floor(alpha W). Extraction and
interpolation both use :func:`window_slices` on the fftshift-ed spectrum, so they address the same coefficients.

Because only the window is ever mixed into another site's images, only the window needs to leave a site
(:func:`amplitude_window`); the paper's reference design shares whole amplitude spectra, which gives the same
training result and exposes H x W / ((2 b_h + 1)(2 b_w + 1)) times more values (:func:`exposure_ratio`).

alpha: the paper sets 0.01 (section 4.2). The authors' released code effectively swapped only the DC coefficient
(a window of half-width 0) and its demo used alpha = 0.003. At small CPU image sizes alpha = 0.01 gives
b = 0 below 100 px: the DC coefficient alone, i.e. only the image mean, which a per-image z-score erases. The
half-width is therefore floored at ``min_half_width`` (default 1, a 3 x 3 window), and the interpolation is
applied to the network's input after the project's intensity normalisation, which nothing re-normalises.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def window_half_widths(height: int, width: int, alpha: float, min_half_width: int = 1) -> tuple[int, int]:
    """(b_h, b_w) = (max(floor(alpha H), m), max(floor(alpha W), m)), m = ``min_half_width``.

    Raises:
        ValueError: alpha < 0, a negative minimum, or a window of 2 b + 1 coefficients that does not fit the
            image (the message gives both sizes).
    """
    if alpha < 0 or min_half_width < 0:
        raise ValueError(f"alpha and min_half_width must be >= 0, got {alpha} and {min_half_width}")
    # A small epsilon so that 0.01 * 300 is 3, not 2.9999999999999996.
    bh = max(int(math.floor(alpha * height + 1e-9)), min_half_width)
    bw = max(int(math.floor(alpha * width + 1e-9)), min_half_width)
    if 2 * bh + 1 > height or 2 * bw + 1 > width:
        raise ValueError(f"an image of {height}x{width} px is smaller than the amplitude window "
                         f"{2 * bh + 1}x{2 * bw + 1} (alpha={alpha}, min_half_width={min_half_width})")
    return bh, bw


def window_slices(height: int, width: int, half_widths: tuple[int, int]) -> tuple[slice, slice]:
    """Row and column slices of the window M in an fftshift-ed (H, W) spectrum (zero frequency at H//2, W//2)."""
    bh, bw = half_widths
    ch, cw = height // 2, width // 2
    return slice(ch - bh, ch + bh + 1), slice(cw - bw, cw + bw + 1)


def exposure_ratio(height: int, width: int, half_widths: tuple[int, int]) -> float:
    """Values per channel of the full amplitude spectrum divided by those of the window."""
    bh, bw = half_widths
    return height * width / ((2 * bh + 1) * (2 * bw + 1))


def amplitude_window(images: np.ndarray, half_widths: tuple[int, int]) -> np.ndarray:
    """The centred low-frequency window of each image's amplitude spectrum: what a site contributes to the bank.

    Args:
        images: (N, C, H, W) real images, as the network receives them.
        half_widths: (b_h, b_w) from :func:`window_half_widths`.

    Returns:
        (N, C, 2 b_h + 1, 2 b_w + 1) float32, non-negative. No phase, nothing outside the window.
    """
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"expected images of shape (N, C, H, W), got {images.shape}")
    h, w = images.shape[-2:]
    bh, bw = half_widths
    if 2 * bh + 1 > h or 2 * bw + 1 > w:
        raise ValueError(f"an image of {h}x{w} px is smaller than the amplitude window {2 * bh + 1}x{2 * bw + 1}")
    rows, cols = window_slices(h, w, half_widths)
    spectrum = np.fft.fftshift(np.fft.fft2(images.astype(np.float64), axes=(-2, -1)), axes=(-2, -1))
    return np.abs(spectrum[..., rows, cols]).astype(np.float32)


def interpolate_amplitude(images: torch.Tensor, other_windows: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Eq. (2)-(3): move each image's low-frequency amplitude towards another site's, keep its phase.

    Args:
        images: (B, C, H, W) real local images x_i^k.
        other_windows: (B, C, 2 b_h + 1, 2 b_w + 1) amplitude windows A_j^n from the bank, one per image
            (the half-widths are read from this shape).
        lam: (B,) interpolation ratios lambda in [0, 1].

    Returns:
        (B, C, H, W) transformed images x_{i,lambda}^{k->n}, same dtype and device as ``images``. Per channel for
        RGB. lambda = 0 returns the input (up to FFT round-off).
    """
    if images.ndim != 4 or other_windows.ndim != 4 or other_windows.shape[:2] != images.shape[:2]:
        raise ValueError(f"expected images (B, C, H, W) and windows (B, C, h, w) with the same B and C, "
                         f"got {tuple(images.shape)} and {tuple(other_windows.shape)}")
    if lam.numel() != images.shape[0]:
        raise ValueError(f"expected one lambda per image ({images.shape[0]}), got {lam.numel()}")
    wh, ww = other_windows.shape[-2:]
    if wh % 2 == 0 or ww % 2 == 0:
        raise ValueError(f"an amplitude window has odd sides (2 b + 1), got {wh}x{ww}")
    h, w = images.shape[-2:]
    if wh > h or ww > w:
        raise ValueError(f"an image of {h}x{w} px is smaller than the amplitude window {wh}x{ww}")
    rows, cols = window_slices(h, w, ((wh - 1) // 2, (ww - 1) // 2))
    work = images.float() if images.dtype in (torch.float16, torch.bfloat16) else images
    spectrum = torch.fft.fftshift(torch.fft.fft2(work), dim=(-2, -1))
    amplitude, phase = spectrum.abs(), spectrum.angle()
    lam = lam.to(amplitude.dtype).reshape(-1, 1, 1, 1)
    mixed = (1 - lam) * amplitude[..., rows, cols] + lam * other_windows.to(amplitude.dtype)
    amplitude = amplitude.clone()
    amplitude[..., rows, cols] = mixed
    out = torch.fft.ifft2(torch.fft.ifftshift(torch.polar(amplitude, phase), dim=(-2, -1))).real
    return out.to(images.dtype)


def sample_transfers(
    bank_sizes: dict[str, int],
    own_site: str,
    batch_size: int,
    transforms_per_image: int | None,
    lam_range: tuple[float, float],
    generator: torch.Generator,
) -> tuple[list[list[tuple[str, int]]], torch.Tensor]:
    """Which bank entries and ratios build the meta-test images t_i^k of one batch (section 3.2, last paragraph).

    For each image, ``n_t`` distinct other sites are drawn (all K - 1 of them when ``transforms_per_image`` is None,
    as in the paper, in random order), one random entry of each, and one lambda ~ U(lam_range) per transformed image.

    Returns:
        picks: ``batch_size`` lists of ``n_t`` (site, entry index) pairs;
        lam: (batch_size, n_t) float32 ratios.
    """
    others = sorted(s for s, n in bank_sizes.items() if s != own_site and n > 0)
    if not others:
        raise ValueError(f"the amplitude bank holds no other site's entries than {own_site!r}")
    n_t = len(others) if transforms_per_image is None else transforms_per_image
    if not 1 <= n_t <= len(others):
        raise ValueError(f"transforms_per_image must be between 1 and {len(others)} (other sites in the bank), "
                         f"got {transforms_per_image}")
    lo, hi = lam_range
    picks = []
    for _ in range(batch_size):
        order = torch.randperm(len(others), generator=generator)[:n_t].tolist()
        picks.append([(others[i], int(torch.randint(bank_sizes[others[i]], (1,), generator=generator)))
                      for i in order])
    lam = lo + (hi - lo) * torch.rand((batch_size, n_t), generator=generator)
    return picks, lam
