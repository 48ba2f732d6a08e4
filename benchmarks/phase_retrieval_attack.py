"""Phase-retrieval attack on the ELCFS amplitude payload: what an honest-but-curious server can rebuild from it.

Run on the real sample images by ``python benchmarks/privacy_audit.py``; its thresholds are checked by
tests/test_privacy_audit.py. Not part of the ``feddg`` package: no site or server runs it.

ELCFS (Liu et al., CVPR 2021, section 3.2) shares amplitude spectra |FFT2(x)| of each site's images and keeps the
phase local, arguing that "the raw images cannot be reconstructed with the amplitude spectrum alone". That is a
phase-retrieval claim, and phase retrieval is an old, well-studied attack. This module runs the standard one,
Fienup's hybrid input-output (HIO) followed by error reduction (ER), against the two payloads:

* ``full``: the paper's design, the whole amplitude spectrum (H x W values per channel);
* ``window``: this project's design (:func:`feddg.methods.frequency.amplitude_window`), only the centred
  low-frequency window of the fftshift-ed amplitude, (2 b_h + 1) x (2 b_w + 1) values per channel.

Threat model and the choices it implies (all in the attacker's favour unless said otherwise):

* The attacker knows the image size H x W (it is implied by the training job) and that images are real and
  non-negative intensities. The audit attacks the raw intensity image scaled to [0, 1]; the project actually sends
  the amplitude of the z-scored network input, which differs only at the DC coefficient (zeroed by the z-score)
  and by a global scale, so giving the attacker the raw image's amplitude (DC included) can only help it.
* Support: the real slices fill their frame (MRI anatomy and fundus discs run to the edges), and ELCFS takes the
  FFT at the image size, without zero padding. So the only honest support is the whole frame, i.e. *no* support
  constraint, and no oversampling: the amplitude gives about H W / 2 independent numbers for H W unknowns,
  which is below the uniqueness threshold of phase retrieval. ``support=None`` is the default for real images.
  :func:`centred_support` gives the standard "centred box a bit smaller than the frame" assumption for experiments;
  it is true for compact objects on a zero background (the synthetic test image) and false for full-frame slices.
* Window design: the attacker knows only the window's amplitudes; at every other coefficient the iteration keeps
  its current estimate's Fourier coefficient (magnitude and phase) and only the object-domain constraints act
  there.

Scoring (:func:`reconstruction_quality`): a real image's amplitude is shared by every circular translation of the
image and by its point reflection x(-r) (the conjugate ambiguity), so no attack can do better than "up to these".
The score is taken at the best of them: for the reconstruction and for its point reflection, the circular shift
that maximises Pearson correlation with the original is found exactly, for all H W shifts at once, by FFT
cross-correlation; each metric is the better of the two aligned candidates. The global sign ambiguity (-x has
the same amplitude) does not arise: the non-negativity constraint rules it out. The same scoring is applied to
the trivial guesses (:func:`trivial_guesses`), so the shift search, which inflates every score a little, inflates
the baselines too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from skimage.metrics import structural_similarity

from feddg.methods.frequency import window_half_widths, window_slices

__all__ = [
    "attack_full_spectrum",
    "attack_window",
    "centred_support",
    "format_table",
    "fourier_error",
    "hio_phase_retrieval",
    "reconstruction_quality",
    "run_audit",
    "summarize",
    "synthetic_phantom",
    "trivial_guesses",
]


# ------------------------------------------------------------------------------------------------ helpers


def centred_support(height: int, width: int, fraction: float) -> np.ndarray:
    """Bool (H, W) mask of a centred box covering ``fraction`` of each side (at least 1 px)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    sh, sw = max(1, round(fraction * height)), max(1, round(fraction * width))
    top, left = (height - sh) // 2, (width - sw) // 2
    mask = np.zeros((height, width), bool)
    mask[top : top + sh, left : left + sw] = True
    return mask


def synthetic_phantom(size: int = 32, fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """A control where phase retrieval is well posed: three non-negative shapes (a bright rectangle, a disc, a dim
    square) on a zero background, inside the centred box of ``fraction`` of each side, which is returned as the
    support. With fraction <= 0.5 the spectrum is oversampled at least 2x per axis relative to the object, the
    classical condition for (almost always) unique phase retrieval.

    Returns:
        (image (size, size) float64 in [0, 1], support (size, size) bool).
    """
    img = np.zeros((size, size))
    s = round(fraction * size)
    o = (size - s) // 2
    yy, xx = np.mgrid[:size, :size]
    img[o + round(s * 0.06) : o + round(s * 0.38), o + round(s * 0.12) : o + round(s * 0.56)] = 1.0
    img[(yy - (o + s * 0.65)) ** 2 + (xx - (o + s * 0.6)) ** 2 < (s * 0.22) ** 2] = 0.6
    img[o + s - round(s * 0.31) : o + s - round(s * 0.06), o + round(s * 0.06) : o + round(s * 0.25)] = 0.3
    return img, centred_support(size, size, fraction)


def _reflect(a: np.ndarray) -> np.ndarray:
    """a(-k) on the unshifted DFT grid (index 0 stays at 0): the Hermitian partner of every coefficient."""
    return np.roll(a[::-1, ::-1], 1, axis=(0, 1))


def _prepare(amplitude: np.ndarray, known_mask: np.ndarray, shifted: bool) -> tuple[np.ndarray, np.ndarray]:
    """Unshifted float64 amplitude and bool mask, completed by Hermitian symmetry (|F(-k)| = |F(k)| for real x)."""
    amplitude = np.asarray(amplitude, dtype=np.float64)
    known = np.asarray(known_mask, dtype=bool)
    if amplitude.ndim != 2 or known.shape != amplitude.shape:
        raise ValueError(f"expected a 2D amplitude and a mask of the same shape, "
                         f"got {amplitude.shape} and {known.shape}")
    if shifted:
        amplitude, known = np.fft.ifftshift(amplitude), np.fft.ifftshift(known)
    if np.any(amplitude[known] < 0):
        raise ValueError("amplitudes must be non-negative")
    partner = _reflect(known)
    amplitude = np.where(known, amplitude, np.where(partner, _reflect(amplitude), 0.0))
    return amplitude, known | partner


def fourier_error(estimate: np.ndarray, amplitude: np.ndarray, known_mask: np.ndarray, shifted: bool = False) -> float:
    """Relative Fourier-magnitude error on the known coefficients: ||(|F(estimate)| - A)||_known / ||A||_known."""
    amplitude, known = _prepare(amplitude, known_mask, shifted)
    mag = np.abs(np.fft.fft2(np.asarray(estimate, np.float64)))
    den = np.sqrt(np.sum(amplitude[known] ** 2))
    return float(np.sqrt(np.sum((mag[known] - amplitude[known]) ** 2)) / max(den, 1e-300))


# ------------------------------------------------------------------------------------------------ the attack


def _hio_once(amp_half: np.ndarray, known_half: np.ndarray, shape: tuple[int, int], allowed: np.ndarray,
              iterations: int, er_iterations: int, er_every: int, er_block: int, beta: float,
              rng: np.random.Generator, dc: float | None) -> np.ndarray:
    g = rng.random(shape) * allowed
    if dc is not None and g.sum() > 0:
        g *= dc / g.sum()  # a start with the right mean when the attacker knows the DC
    n_hio = iterations - er_iterations
    for it in range(iterations):
        G = np.fft.rfft2(g)
        mag = np.abs(G)
        # Fourier projection: impose the known magnitudes, keep the phase; keep unknown coefficients as they are.
        G = np.where(known_half, amp_half * G / np.maximum(mag, 1e-12), G)
        g1 = np.fft.irfft2(G, s=shape)
        ok = allowed & (g1 >= 0)
        er = it >= n_hio or (er_every > 0 and it % er_every >= er_every - er_block)
        if er:
            g = np.where(ok, g1, 0.0)
        else:
            g = np.where(ok, g1, g - beta * g1)
    return np.where(allowed, np.maximum(g, 0.0), 0.0)


def hio_phase_retrieval(
    amplitude: np.ndarray,
    known_mask: np.ndarray,
    iterations: int,
    beta: float = 0.9,
    seed: int = 0,
    support: np.ndarray | None = None,
    *,
    shifted: bool = False,
    restarts: int = 1,
    er_iterations: int | None = None,
    er_every: int = 100,
    er_block: int = 10,
) -> np.ndarray:
    """Fienup's hybrid input-output phase retrieval of a real, non-negative image from (some of) its DFT magnitudes.

    Object constraints: real, >= 0, and zero outside ``support`` when given. Fourier constraint: at the
    coefficients in ``known_mask`` the magnitude is replaced by ``amplitude`` (phase kept); at the others the
    current estimate's coefficient is kept. HIO update where the object constraints are violated:
    g <- g - beta * g', elsewhere g <- g'. Every ``er_every`` iterations the last ``er_block`` are error-reduction
    steps (g <- g' where allowed, else 0), and the run ends with ``er_iterations`` ER steps
    (default ``max(20, iterations // 10)``), the usual HIO+ER schedule.

    Args:
        amplitude: (H, W) DFT magnitudes of the image; unshifted (``np.fft.fft2`` order, DC at [0, 0]) by default,
            fftshift-ed (DC at [H // 2, W // 2]) with ``shifted=True``. Values outside ``known_mask`` are ignored.
        known_mask: (H, W) bool, same order as ``amplitude``: the coefficients the attacker knows. Completed by
            Hermitian symmetry (knowing |F(k)| of a real image is knowing |F(-k)|).
        iterations: total iterations per restart (HIO, periodic ER, final ER).
        beta: HIO feedback parameter.
        seed: seeds a numpy Generator; the result is deterministic given the seed.
        support: (H, W) bool, unshifted image coordinates, or None for the whole frame (non-negativity only).
        restarts: independent random starts; the one with the smallest :func:`fourier_error` on the known
            coefficients is returned (the attacker can compute that error, it cannot compute the true error).

    Returns:
        (H, W) float64 non-negative estimate, zero outside the support.
    """
    amp, known = _prepare(amplitude, known_mask, shifted)
    h, w = amp.shape
    if iterations < 1 or restarts < 1:
        raise ValueError(f"iterations and restarts must be >= 1, got {iterations} and {restarts}")
    allowed = np.ones((h, w), bool) if support is None else np.asarray(support, bool)
    if allowed.shape != (h, w):
        raise ValueError(f"support must have shape {(h, w)}, got {allowed.shape}")
    er_final = max(20, iterations // 10) if er_iterations is None else er_iterations
    er_final = min(er_final, iterations)
    half = w // 2 + 1
    amp_half, known_half = amp[:, :half], known[:, :half]
    dc = float(amp[0, 0]) if known[0, 0] else None
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(restarts)]
    best, best_err = None, np.inf
    for rng in rngs:
        g = _hio_once(amp_half, known_half, (h, w), allowed, iterations, er_final, er_every, er_block, beta, rng, dc)
        err = fourier_error(g, amp, known)
        if err < best_err:
            best, best_err = g, err
    return best


def attack_full_spectrum(image: np.ndarray, iterations: int = 1000, restarts: int = 4, seed: int = 0,
                         support: np.ndarray | None = None, beta: float = 0.9) -> np.ndarray:
    """The paper's payload: the server holds |FFT2(image)| (all H x W values) and knows H, W."""
    image = np.asarray(image, np.float64)
    amplitude = np.abs(np.fft.fft2(image))
    return hio_phase_retrieval(amplitude, np.ones(image.shape, bool), iterations, beta=beta, seed=seed,
                               support=support, restarts=restarts)


def attack_window(image: np.ndarray, alpha: float = 0.01, min_half_width: int = 1, iterations: int = 1000,
                  restarts: int = 4, seed: int = 0, support: np.ndarray | None = None,
                  beta: float = 0.9) -> np.ndarray:
    """This project's payload: the server holds only the window that :func:`amplitude_window` sends, and H, W.

    The window is cut exactly as the site cuts it (``window_half_widths`` / ``window_slices`` on the fftshift-ed
    spectrum) and placed back into an otherwise unknown H x W spectrum.
    """
    image = np.asarray(image, np.float64)
    h, w = image.shape
    rows, cols = window_slices(h, w, window_half_widths(h, w, alpha, min_half_width))
    sent = np.abs(np.fft.fftshift(np.fft.fft2(image)))[rows, cols]  # == amplitude_window(image[None, None])[0, 0]
    amplitude = np.zeros((h, w))
    known = np.zeros((h, w), bool)
    amplitude[rows, cols] = sent
    known[rows, cols] = True
    return hio_phase_retrieval(amplitude, known, iterations, beta=beta, seed=seed, support=support,
                               restarts=restarts, shifted=True)


def trivial_guesses(height: int, width: int, dc: float, support: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Guesses any attacker can make from the window's DC alone (the image sum): a constant image and a centred
    Gaussian blob (sigma = a sixth of each side), both with the mean dc / (H W); with a support, also the support
    filled uniformly with the same sum (the fair baseline when the attacker is credited with knowing the support)."""
    mean = dc / (height * width)
    yy, xx = np.mgrid[:height, :width]
    blob = np.exp(-(((yy - (height - 1) / 2) / (height / 6)) ** 2 + ((xx - (width - 1) / 2) / (width / 6)) ** 2) / 2)
    out = {"constant": np.full((height, width), mean), "blob": blob * (mean / blob.mean())}
    if support is not None:
        support = np.asarray(support, bool)
        out["support box"] = support * (dc / max(int(support.sum()), 1))
    return out


# ------------------------------------------------------------------------------------------------ scoring


def _best_shift(a0: np.ndarray, cand: np.ndarray) -> tuple[float, tuple[int, int]]:
    """Max Pearson correlation of ``a0`` (mean-free, unit norm) with any circular shift of cand, and that shift."""
    b = cand - cand.mean()
    nb = np.linalg.norm(b)
    if nb < 1e-12:
        return 0.0, (0, 0)
    cc = np.fft.irfft2(np.fft.rfft2(a0) * np.conj(np.fft.rfft2(b / nb)), s=a0.shape)  # cc[s] = <a, roll(b, s)>
    idx = np.unravel_index(int(np.argmax(cc)), cc.shape)
    return float(cc[idx]), (int(idx[0]), int(idx[1]))


def reconstruction_quality(image: np.ndarray, recon: np.ndarray) -> dict:
    """SSIM and Pearson correlation of ``recon`` with ``image``, at the best trivial phase-retrieval ambiguity.

    The candidates are ``recon`` and its point reflection ``recon[::-1, ::-1]``, each circularly shifted to the
    alignment of maximal correlation (exhaustive over all shifts via FFT cross-correlation). Each metric is the
    better of the two candidates. SSIM: ``skimage.metrics.structural_similarity`` with ``data_range`` = the
    original's max - min. A constant reconstruction has correlation 0.

    Returns:
        {"ssim", "corr", "shift": (dy, dx) of the best-correlated candidate, "flipped": whether that is the
        reflection}.
    """
    image = np.asarray(image, np.float64)
    recon = np.asarray(recon, np.float64)
    if image.shape != recon.shape or image.ndim != 2:
        raise ValueError(f"expected two 2D arrays of one shape, got {image.shape} and {recon.shape}")
    a = image - image.mean()
    na = np.linalg.norm(a)
    a0 = a / na if na > 1e-12 else a
    data_range = float(image.max() - image.min()) or 1.0
    best = {"ssim": -np.inf, "corr": -np.inf, "shift": (0, 0), "flipped": False}
    for flipped, cand in ((False, recon), (True, recon[::-1, ::-1])):
        corr, shift = _best_shift(a0, cand)
        aligned = np.roll(cand, shift, axis=(0, 1))
        ssim = float(structural_similarity(image, aligned, data_range=data_range))
        best["ssim"] = max(best["ssim"], ssim)
        if corr > best["corr"]:
            best.update(corr=corr, shift=shift, flipped=flipped)
    return best


# ------------------------------------------------------------------------------------------------ the audit


def _window_mask(height: int, width: int, alpha: float, min_half_width: int) -> np.ndarray:
    """Bool (H, W), unshifted DFT order: the coefficients the window design sends."""
    rows, cols = window_slices(height, width, window_half_widths(height, width, alpha, min_half_width))
    mask = np.zeros((height, width), bool)
    mask[rows, cols] = True
    return np.fft.ifftshift(mask)


def run_audit(
    images: Sequence[tuple[str, np.ndarray]],
    alpha: float = 0.01,
    min_half_width: int = 1,
    iterations: int = 1000,
    restarts: int = 4,
    seed: int = 0,
    support_fraction: float | None = None,
    beta: float = 0.9,
) -> list[dict]:
    """Both attacks and the trivial guesses on each (name, 2D non-negative image).

    ``support_fraction``: None (default) gives the attacker no support (the whole frame); a number gives both
    attacks the centred box of that fraction of each side (:func:`centred_support`).

    Returns:
        one dict per (image, design) with keys image, design ("full", "window", "guess: constant",
        "guess: blob", and "guess: support box" when a support is given), values (amplitude values the server
        receives per channel; for a guess, those of the window it is derived from), ssim, corr, fourier_error
        (relative magnitude misfit of the reconstruction on the coefficients the attacker knows, which the attacker
        can compute: near 0 means the attack converged to an image consistent with everything it received; NaN for
        guesses), seconds (attack time; 0 for guesses).
    """
    rows = []
    for name, image in images:
        image = np.asarray(image, np.float64)
        if image.ndim != 2:
            raise ValueError(f"{name}: expected a 2D image, got shape {image.shape}")
        h, w = image.shape
        bh, bw = window_half_widths(h, w, alpha, min_half_width)
        n_window = (2 * bh + 1) * (2 * bw + 1)
        support = None if support_fraction is None else centred_support(h, w, support_fraction)
        for design, n_values in (("full", h * w), ("window", n_window)):
            t = time.perf_counter()
            if design == "full":
                recon = attack_full_spectrum(image, iterations, restarts, seed, support, beta)
            else:
                recon = attack_window(image, alpha, min_half_width, iterations, restarts, seed, support, beta)
            seconds = time.perf_counter() - t
            q = reconstruction_quality(image, recon)
            known = np.ones((h, w), bool) if design == "full" else _window_mask(h, w, alpha, min_half_width)
            ferr = fourier_error(recon, np.abs(np.fft.fft2(image)), known)
            rows.append({"image": name, "design": design, "values": n_values, "ssim": q["ssim"], "corr": q["corr"],
                         "fourier_error": ferr, "seconds": seconds})
        for guess, g in trivial_guesses(h, w, float(image.sum()), support).items():
            q = reconstruction_quality(image, g)
            rows.append({"image": name, "design": f"guess: {guess}", "values": n_window, "ssim": q["ssim"],
                         "corr": q["corr"], "fourier_error": float("nan"), "seconds": 0.0})
    return rows


def summarize(rows: Sequence[dict]) -> dict[str, dict]:
    """design -> {"n", "values", "ssim", "corr", "fourier_error", "seconds"}: means over the images."""
    out: dict[str, dict] = {}
    for design in dict.fromkeys(r["design"] for r in rows):
        sel = [r for r in rows if r["design"] == design]
        out[design] = {"n": len(sel), **{k: float(np.mean([r[k] for r in sel]))
                                         for k in ("values", "ssim", "corr", "fourier_error", "seconds")}}
    return out


def format_table(rows: Sequence[dict]) -> str:
    """A plain-text table of the rows followed by the per-design means."""
    head = f"{'design':<16} {'values/ch':>9} {'SSIM':>7} {'corr':>7} {'F-err':>7} {'time s':>7}"
    lines = [f"{'image':<36} {head}"]
    for r in rows:
        lines.append(f"{r['image']:<36} {r['design']:<16} {r['values']:>9d} {r['ssim']:>7.3f} {r['corr']:>7.3f} "
                     f"{r['fourier_error']:>7.3f} {r['seconds']:>7.2f}")
    lines.append("")
    lines.append(f"{'mean over images':<36} {head}")
    for design, s in summarize(rows).items():
        lines.append(f"{'(n=' + str(s['n']) + ')':<36} {design:<16} {s['values']:>9.0f} {s['ssim']:>7.3f} "
                     f"{s['corr']:>7.3f} {s['fourier_error']:>7.3f} {s['seconds']:>7.2f}")
    return "\n".join(lines)
