"""Synthetic fundus photographs: 4 fundus "domains" (``FUNDUS_SITES``, the site names of the DoFE multi-site fundus
data), optic-disc-centred RGB ROIs written in the DoFE PNG layout.

Layout: ``<out>/Domain<k>/{train,test}/ROIs/{image,mask}/<name>.png`` (:func:`fundus_split` decides how many images
go to test); masks are 3-channel PNGs with cup = 0, rim = 128, background = 255 (disc = rim ∪ cup).

Anatomy: an orange-red vignetted retina with mottling, a bright optic disc (sometimes a pale peripapillary halo
outside it), a brighter cup inside it with a soft edge and dark vessels radiating from the cup.

Sites differ by their camera style (``FundusStyle``, one per site in ``FUNDUS_STYLES``): colour cast, brightness,
intensity curve (gamma), contrast, vignetting, Gaussian noise, blur, acquisition resolution (downsampled then
upsampled), field of view (disc zoom) and a camera field-of-view border.

With ``SyntheticConfig.shift == "style_and_content"`` (the default) they also differ by their patients and their
annotators (``FundusContent``, one per site in ``FUNDUS_CONTENT``): disc size and ellipticity, the cup-to-disc
ratio (CDR, vertical diameters; a glaucoma-rich site has large cups), and the labelling convention (disc and cup
masks dilated or eroded, contours smoothed). Pixel amounts are at size 96 and scale with the image:

    domain   disc (size x, vertical/horizontal)   CDR range    labelling convention
    Domain1  x1.00, oval 1.12                     0.45-0.72    cup +0.5 px (generous), smoothed (sigma 1.5 px)
    Domain2  x0.97, round 1.03                    0.42-0.69    on the outlines, raw contours
    Domain3  x0.96, oval 1.10                     0.37-0.64    on the outlines, smoothed (sigma 2 px)
    Domain4  x1.05, oval 1.16                     0.39-0.66    disc +1 px (generous), cup -0.5 px (tight), smoothed
                                                               (sigma 1 px)

so the mean labelled cup-to-disc area ratio is ordered Domain4 < Domain3 < Domain2 < Domain1 (Domain1 imitates a
glaucoma-rich collection labelled generously; Domain4 draws its discs wide and its cups tight, which puts it below
Domain3 although its CDR range is higher). With ``shift == "style_only"`` every domain draws from
``NEUTRAL_FUNDUS_CONTENT`` (disc x1.00, vertical/horizontal 1.0-1.15, CDR 0.40-0.70, masks on the outlines):
domains differ by style alone.

The PNG files carry no metadata chunks, so their bytes depend on the pixels alone.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage

from feddg.config import SyntheticConfig

from .common import (
    annotate, case_rng, degrade, sigmoid, signed_distance_px, site_content, smooth_noise, write_bytes,
)

FUNDUS_SITES = ("Domain1", "Domain2", "Domain3", "Domain4")


@dataclass(frozen=True)
class FundusStyle:
    """How one fundus camera renders an RGB [0, 1] retina image.

    Order: colour cast -> brightness -> gamma -> contrast about the image mean -> vignetting -> blur
    -> downsample -> Gaussian noise -> upsample -> camera field-of-view border -> uint8.
    """

    gain: tuple[float, float, float]  # colour cast: per-channel (R, G, B) gain
    brightness: float  # global gain
    gamma: float  # intensity curve, x ** gamma
    contrast: float  # stretch about the image mean
    vignette: float  # darkening towards the corners, 1 - vignette * r^2 (r = 1 at the edge midpoints)
    noise: float  # Gaussian noise sigma (per channel), in [0, 1] units
    blur: float  # Gaussian blur sigma at size 96 (px)
    downsample: float  # acquisition resolution factor below the stored size (1 = none)
    zoom: float  # > 1 makes the disc larger in the ROI
    fov_border: bool  # a dark circular camera field-of-view edge cuts a corner of the ROI


FUNDUS_STYLES: dict[str, FundusStyle] = {
    # Drishti-GS-like: dark, deep red, strong vignetting.
    "Domain1": FundusStyle(gain=(1.00, 0.72, 0.58), brightness=0.80, gamma=1.20, contrast=1.00, vignette=0.45,
                           noise=0.010, blur=0.8, downsample=1.00, zoom=1.00, fov_border=False),
    # RIM-ONE-like: desaturated, low contrast, soft, larger disc.
    "Domain2": FundusStyle(gain=(0.85, 0.95, 1.05), brightness=0.95, gamma=0.90, contrast=0.70, vignette=0.20,
                           noise=0.020, blur=1.3, downsample=1.50, zoom=1.20, fov_border=False),
    # REFUGE-train-like (Zeiss): green-yellow cast, camera border, smaller disc.
    "Domain3": FundusStyle(gain=(0.85, 1.10, 0.50), brightness=0.90, gamma=1.10, contrast=1.10, vignette=0.35,
                           noise=0.015, blur=0.5, downsample=1.00, zoom=0.90, fov_border=True),
    # REFUGE-validation-like (Canon): bright, pink, noisier.
    "Domain4": FundusStyle(gain=(1.05, 0.85, 0.90), brightness=1.10, gamma=0.80, contrast=1.00, vignette=0.15,
                           noise=0.025, blur=0.3, downsample=1.25, zoom=1.00, fov_border=False),
}


@dataclass(frozen=True)
class FundusContent:
    """What one fundus site images and how its annotators label it (the patients and the convention, not the camera).

    Pixel amounts are at size 96 and scale with ``SyntheticConfig.size``. The neutral entry
    (``NEUTRAL_FUNDUS_CONTENT``) is the common distribution every site draws from under ``shift: style_only``.
    """

    disc_scale: float  # multiplies the disc radius (common draw: 0.28-0.38 of the half ROI, times the style's zoom)
    ellipticity: float  # mean vertical / horizontal disc axis ratio; each case draws within +-0.075 of it
    cdr: tuple[float, float]  # range of the cup-to-disc ratio (of the vertical diameters), drawn uniformly
    disc_margin: float  # px: > 0 the disc mask reaches past the visible disc edge (dilated), < 0 stops inside
    cup_margin: float  # px: the same for the cup mask (the cup keeps a rim of disc around it in any case)
    label_smoothing: float  # px: in-plane Gaussian sigma applied to both masks (smoothed, rounder contours)


NEUTRAL_FUNDUS_CONTENT = FundusContent(disc_scale=1.0, ellipticity=1.075, cdr=(0.4, 0.7), disc_margin=0.0,
                                       cup_margin=0.0, label_smoothing=0.0)

# One entry per domain; the module docstring tables them. The CDR ranges are 0.27 wide and their centres 0.02 to
# 0.05 apart, so the domains overlap widely while the means are ordered. The cup is small at the network's input
# size (a radius of 3 to 6 px at 64 px) and its image edge is soft, so a model takes much of its cup size from the
# labels it was trained on: wider CDR gaps or larger cup margins than these made the unseen domain's cup Dice fall
# from 0.77 to 0.34-0.50 (Domain3 held out, pooled training on the other three, 64 px, 3 seeds); with these it falls
# to 0.63 and the other domains lose at most 0.04 on either structure: moderate by design.
FUNDUS_CONTENT: dict[str, FundusContent] = {
    "Domain1": FundusContent(disc_scale=1.00, ellipticity=1.12, cdr=(0.45, 0.72), disc_margin=0.0, cup_margin=0.5,
                             label_smoothing=1.5),
    "Domain2": FundusContent(disc_scale=0.97, ellipticity=1.03, cdr=(0.42, 0.69), disc_margin=0.0, cup_margin=0.0,
                             label_smoothing=0.0),
    "Domain3": FundusContent(disc_scale=0.96, ellipticity=1.10, cdr=(0.37, 0.64), disc_margin=0.0, cup_margin=0.0,
                             label_smoothing=2.0),
    "Domain4": FundusContent(disc_scale=1.05, ellipticity=1.16, cdr=(0.39, 0.66), disc_margin=1.0, cup_margin=-0.5,
                             label_smoothing=1.0),
}


def fundus_content(site: str, shift: str) -> FundusContent:
    """The content and labelling a domain draws from: its own entry, or the neutral one under ``style_only``."""
    return site_content(FUNDUS_CONTENT, NEUTRAL_FUNDUS_CONTENT, site, shift)


def _perturbed_radius(theta: np.ndarray, rng: np.random.Generator, amp: float) -> np.ndarray:
    a2, a3, p2, p3 = rng.uniform(0, amp), rng.uniform(0, amp * 0.6), rng.uniform(0, 2 * np.pi), rng.uniform(0, 2 * np.pi)
    return 1.0 + a2 * np.cos(2 * theta + p2) + a3 * np.cos(3 * theta + p3)


def _fundus_anatomy(
    rng: np.random.Generator, size: int, zoom: float, content: FundusContent
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RGB retina ``(size, size, 3)`` in [0, 1], disc and cup masks ``(size, size)`` bool (cup ⊂ disc, with a rim).

    ``zoom`` is the style's field of view; ``content`` sets the disc size and shape, the cup-to-disc ratio and how
    the masks are drawn from the imaged outlines (margins, smoothing).
    """
    lin = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0
    y, x = np.meshgrid(lin, lin, indexing="ij")
    ppu = size / 2.0
    px = size / 96.0
    def u(lo: float, hi: float) -> float:
        return float(rng.uniform(lo, hi))

    # Background retina: orange-red, mottled, darker towards the macula side.
    mott = smooth_noise(rng, (size, size), 6.0 * px)
    fine = smooth_noise(rng, (size, size), 1.0 * px)
    macula_side = 1.0 if rng.random() < 0.5 else -1.0
    shade = 1.0 - 0.12 * sigmoid(macula_side * x * 3.0)
    base = np.array([0.78, 0.36, 0.18], np.float32)
    img = base[None, None, :] * (shade * (1.0 + 0.07 * mott + 0.02 * fine))[..., None]

    # Optic disc: perturbed ellipse, brighter towards its centre.
    dcx, dcy = u(-0.12, 0.12), u(-0.12, 0.12)
    rd = u(0.28, 0.38) * zoom * content.disc_scale
    ax, ay = rd, rd * (content.ellipticity + u(-0.075, 0.075))
    th = np.arctan2((y - dcy) / ay, (x - dcx) / ax)
    q_disc = np.sqrt(((x - dcx) / ax) ** 2 + ((y - dcy) / ay) ** 2) / _perturbed_radius(th, rng, 0.06)
    disc_soft = sigmoid((1.0 - q_disc) * rd * ppu / 1.0)
    if rng.random() < 0.5:  # peripapillary atrophy: a pale halo just outside the disc
        halo = sigmoid((1.0 - q_disc / u(1.15, 1.35)) * rd * ppu / 1.5) * (1 - disc_soft)
        img = img * (1 - 0.35 * halo[..., None]) + 0.35 * halo[..., None] * np.array([0.85, 0.6, 0.35], np.float32)
    disc_col = np.array([0.93, 0.66, 0.42], np.float32) * (1.0 + 0.05 * (1.0 - q_disc.clip(0, 1)))[..., None]
    img = img * (1 - disc_soft[..., None]) + disc_col * disc_soft[..., None]

    # Cup: inside the disc (centre offset <= 0.15 disc radius, radius <= 0.7), soft edged, brighter.
    cdr = u(*content.cdr)
    ccx, ccy = dcx + u(-0.15, 0.15) * rd, dcy + u(-0.15, 0.15) * rd
    cax, cay = cdr * ax, cdr * ay * u(0.95, 1.1)
    th_c = np.arctan2((y - ccy) / cay, (x - ccx) / cax)
    q_cup = np.sqrt(((x - ccx) / cax) ** 2 + ((y - ccy) / cay) ** 2) / _perturbed_radius(th_c, rng, 0.05)
    cup_soft = sigmoid((1.0 - q_cup) * min(cax, cay) * ppu / 1.6) * u(0.55, 0.9)
    img = img * (1 - cup_soft[..., None]) + np.array([1.0, 0.88, 0.7], np.float32) * cup_soft[..., None]

    # Vessels: dark curved lines radiating from the cup, tapering outwards. Each is a polyline of
    # 24 segments; a pixel's darkening follows its distance to the nearest segment.
    px_, py_ = x.reshape(-1, 1), y.reshape(-1, 1)  # (H*W, 1)
    darken = np.zeros(size * size, np.float32)
    t = np.linspace(0.0, 1.0, 25, dtype=np.float32)
    rows = np.arange(size * size)
    for _ in range(int(rng.integers(8, 14))):
        ang, bend, length = u(0, 2 * np.pi), u(-0.8, 0.8), u(1.0, 2.2)
        w0, strength = u(0.012, 0.028), u(0.5, 0.85)
        angles = ang + bend * t**2
        radii = 0.2 * cdr * rd + length * t
        cx_, cy_ = ccx + radii * np.cos(angles), ccy + radii * np.sin(angles)  # (25,) polyline
        ax_, ay_ = cx_[None, :-1], cy_[None, :-1]  # segment starts (1, 24)
        sx, sy = np.diff(cx_)[None], np.diff(cy_)[None]  # segment vectors (1, 24)
        proj = np.clip(((px_ - ax_) * sx + (py_ - ay_) * sy) / (sx**2 + sy**2), 0.0, 1.0)  # (H*W, 24)
        d2 = (px_ - ax_ - proj * sx) ** 2 + (py_ - ay_ - proj * sy) ** 2
        k = np.argmin(d2, axis=1)
        width = w0 * (1.0 - 0.6 * (k + proj[rows, k]) / 24.0)  # taper along the vessel
        darken = np.maximum(darken, np.exp(-d2[rows, k] / width**2) * strength)
    darken = darken.reshape(size, size)[..., None]
    img = img * (1 - darken * np.array([0.45, 0.65, 0.55], np.float32))
    disc, cup = _annotate_fundus(q_disc, q_cup, content)
    return img.astype(np.float32), disc, cup


def _annotate_fundus(q_disc: np.ndarray, q_cup: np.ndarray, content: FundusContent) -> tuple[np.ndarray, np.ndarray]:
    """Disc and cup masks ``(H, W)`` bool of the imaged outlines (normalised radii ``q_*`` ``(H, W)``, < 1 inside),
    drawn by the site's convention; the cup keeps a rim of disc all around and is not empty (unless the disc is too
    small to keep a rim at all)."""
    size = q_disc.shape[0]
    px = size / 96.0
    disc = annotate(signed_distance_px(q_disc), content.disc_margin, content.label_smoothing, px)
    d_cup = signed_distance_px(q_cup)
    # Keep a rim of at least one pixel (two at size 96) all around: a cup reaching the disc edge is
    # not anatomical and would make the rim label vanish there.
    allowed = ndimage.binary_erosion(disc, iterations=max(1, round(size / 48)))
    cup = annotate(d_cup, content.cup_margin, content.label_smoothing, px) & allowed
    if not cup.any() and allowed.any():
        # A small cup drawn tight at a small size can vanish; the annotator still marks its deepest pixel.
        cup = allowed & (d_cup == d_cup[allowed].max())
    return disc, cup


def _acquire_fundus(rgb: np.ndarray, style: FundusStyle, rng: np.random.Generator) -> np.ndarray:
    """Apply a camera style to an RGB [0, 1] image ``(H, W, 3)``; returns uint8 ``(H, W, 3)``."""
    size = rgb.shape[0]
    gain = np.array(style.gain, np.float32) * rng.uniform(0.95, 1.05, 3).astype(np.float32)
    x = np.clip(rgb * gain * style.brightness * float(rng.uniform(0.93, 1.07)), 0.0, 1.0)
    x = x ** (style.gamma * float(rng.uniform(0.95, 1.05)))
    x = (x - x.mean()) * style.contrast + x.mean()
    lin = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0
    yy, xx = np.meshgrid(lin, lin, indexing="ij")
    vx, vy = rng.uniform(-0.2, 0.2, 2)
    x = x * (1.0 - style.vignette * ((xx - vx) ** 2 + (yy - vy) ** 2) / 2.0)[..., None]
    sigma = style.noise * float(rng.uniform(0.9, 1.1))

    def gaussian(a: np.ndarray) -> np.ndarray:
        return a + rng.standard_normal(a.shape).astype(np.float32) * sigma

    x = degrade(x.astype(np.float32), style.blur, style.downsample, gaussian, size / 96.0)
    if style.fov_border:
        # The camera's circular field of view, centred away from the disc, cuts off one corner.
        ang = float(rng.uniform(0, 2 * np.pi))
        r_fov = float(rng.uniform(2.2, 2.6))
        fx, fy = -np.cos(ang) * (r_fov - 1.2), -np.sin(ang) * (r_fov - 1.2)
        inside = sigmoid((r_fov - np.sqrt((xx - fx) ** 2 + (yy - fy) ** 2)) * size / 2.0 / 1.0)
        x = x * inside[..., None] + 0.02 * (1 - inside[..., None])
    return np.clip(np.rint(np.clip(x, 0.0, 1.0) * 255.0), 0, 255).astype(np.uint8)


def _png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # No text/time chunks are written unless asked for (pnginfo), so the bytes depend on the pixels.
    Image.fromarray(arr, mode="RGB").save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def _write_png(path: Path, arr: np.ndarray) -> None:
    write_bytes(path, _png_bytes(arr))


def fundus_split(cases_per_site: int) -> tuple[int, int]:
    """(train, test) image counts: a quarter (at least one) for test, the rest (at least one) for train."""
    if cases_per_site < 2:
        raise ValueError(f"synthetic.cases_per_site: fundus needs >= 2 (a train and a test image), got {cases_per_site}")
    n_test = min(cases_per_site - 1, max(1, round(cases_per_site / 4)))
    return cases_per_site - n_test, n_test


def generate_fundus_site(out_dir: Path, site: str, cfg: SyntheticConfig) -> None:
    """Write ``cfg.cases_per_site`` images and masks of ``site`` into ``out_dir / site`` (DoFE layout)."""
    style = FUNDUS_STYLES[site]
    content = fundus_content(site, cfg.shift)
    n_train, _ = fundus_split(cfg.cases_per_site)
    for case in range(cfg.cases_per_site):
        rng = case_rng(cfg.seed, "fundus", FUNDUS_SITES.index(site), case)
        rgb, disc, cup = _fundus_anatomy(rng, cfg.size, style.zoom, content)
        image = _acquire_fundus(rgb, style, rng)
        mask = np.full(disc.shape, 255, np.uint8)
        mask[disc] = 128
        mask[cup] = 0
        split = "train" if case < n_train else "test"
        name = f"{site.lower()}_{case:03d}.png"
        folder = out_dir / site / split / "ROIs"
        _write_png(folder / "image" / name, image)
        _write_png(folder / "mask" / name, np.repeat(mask[..., None], 3, axis=2))
