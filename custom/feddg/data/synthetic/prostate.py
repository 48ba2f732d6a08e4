"""Synthetic prostate MRI: 6 "hospitals" (``PROSTATE_SITES``, the site names of the SAML multi-site prostate data),
T2-like axial volumes written in the SAML NIfTI layout.

Layout: ``<out>/<SITE>/CaseNN.nii.gz`` + ``CaseNN_segmentation.nii.gz`` (BMC spells it
``CaseNN_Segmentation.nii.gz``, as the real release does). Volumes are ``size x size x slices_per_case`` (the last
axis is the slice axis), mask label 1 = prostate (uint8), each site with its own voxel spacing in the affine and its
own stored data type (int16 or float32).

Anatomy: a pelvis-like body (subcutaneous fat ring, soft tissue, obturator muscles, femoral heads, a bright bladder
at the base slices, a rectum behind the gland) and a prostate made of a randomly shaped ellipsoid (2-, 3- and 5-fold
boundary lobes) that shrinks towards apex and base, so the first and last slices of every volume are empty.
The gland's mean intensity sits between the surrounding soft tissue, muscle and fat/bladder values: it is neither
the brightest nor the darkest structure, and it is told apart by its texture (nodular central gland, brighter
peripheral zone), its dark capsule line and its shape.

Sites differ by their acquisition style (``MRIStyle``, one per site in ``PROSTATE_STYLES``): intensity curve
(gamma), contrast and offset, bias field and coil hot spot, Rician noise, blur, acquisition resolution (downsampled
then upsampled), field of view (anatomy zoom), tissue contrast, voxel spacing and stored data type.

With ``SyntheticConfig.shift == "style_and_content"`` (the default) they also differ by what they image and how
they label it (``ProstateContent``, one per site in ``PROSTATE_CONTENT``): the gland's size, elongation and
boundary irregularity, and the annotation convention (margin, smoothed or jagged outline, how far towards apex and
base slices are labelled). Pixel sizes are at size 96 and scale with the image. "Cut" is the share of the gland's
half-length at that end whose slices show gland but are left unlabelled (at 12 slices per volume, a cut of 0.3
leaves about one gland slice unlabelled at that end, 0.15 about every other volume's end slice):

    site    gland (size x, elongation, outline)     labelling convention
    BIDMC   large x1.12, round 0.90, smooth 0.7     generous: +1 px margin, smoothed (sigma 1.5 px), every slice
    BMC     mean  x1.00, flat  1.20, mean   1.0     tight: -1 px, jagged (0.8 px), apex and base cut 0.15 each
    HK      small x0.88, mean  1.00, lobed  1.6     on the outline, jagged (0.6 px), apex cut 0.3
    I2CVB   small x0.90, flat  1.15, lobed  1.4     generous: +1 px margin, raw outline, base cut 0.2
    RUNMC   mean  x1.00, mean  1.00, mean   1.0     on the outline, lightly smoothed (0.8 px), every slice
    UCL     large x1.10, tall  0.85, smooth 0.6     slightly tight: -0.5 px, smoothed (2 px), every slice

("elongation": the left-right over antero-posterior axis ratio relative to the common distribution; "outline":
the amplitude of the boundary lobes relative to it.) RUNMC, the default unseen site, is the neutral entry in
anatomy. With ``shift == "style_only"`` every site draws from ``NEUTRAL_PROSTATE_CONTENT`` (the common gland
distribution, masks on the outline, every gland slice labelled): sites differ by style alone.

A case's image is drawn from its own generator (``case_rng``) and the annotator's randomness (the jagged outline)
from a second one (``label_rng``), so the labelling convention never changes the image bytes.

The NIfTI files are gzipped with mtime 0 and no file name, so their bytes depend on the data alone.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

from feddg.config import SyntheticConfig

from .common import (
    annotate, case_rng, degrade, label_rng, sigmoid, signed_distance_px, site_content, smooth_noise, write_bytes,
)

PROSTATE_SITES = ("BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL")


@dataclass(frozen=True)
class MRIStyle:
    """How one MRI site acquires and stores its volumes (applied to a [0, 1] tissue signal).

    Order: gamma -> contrast/offset -> multiplicative bias field (ramp and coil hot spot) -> blur ->
    downsample -> Rician noise -> upsample -> scale to the stored type.
    """

    spacing: tuple[float, float, float]  # mm: in-plane (axis 0, axis 1), slice thickness (axis 2)
    dtype: str  # stored type: "int16" or "float32"
    scale: float  # stored value of signal 1.0
    gamma: float  # intensity curve, signal ** gamma
    contrast: float  # multiplies the signal
    offset: float  # added after the contrast
    bias: float  # amplitude of the log bias field (a linear ramp, like a receive-coil profile)
    bias_angle: float  # direction of the ramp in the image plane, degrees
    coil: float  # endorectal-coil hot spot: signal gain at the rectum, falling off over ~1/4 image
    noise: float  # Rician noise sigma, in signal units
    blur: float  # in-plane Gaussian blur sigma at size 96 (px)
    downsample: float  # acquisition resolution: in-plane factor below the stored size (1 = none)
    zoom: float  # field of view: > 1 makes the anatomy larger in the image
    fat: float  # tissue contrast of the sequence: fat signal (soft tissue is 0.38, urine 0.86)
    pz: float  # tissue contrast of the sequence: peripheral-zone signal (central gland is 0.40)


# Each site sits at a different corner of style space; RUNMC (the default unseen site) is the
# middle-of-the-road one. BIDMC alone has an endorectal coil, as in the real collection. A row per site, a
# column per MRIStyle field, in its order.
_STYLE_TABLE: dict[str, tuple] = {
    #        spacing             dtype      scale   gamma contrast offset bias  bias_angle coil noise  blur downsample zoom  fat   pz
    "BIDMC": ((0.63, 0.63, 3.0), "int16",   1000.0, 1.0,  1.0,     0.0,   0.2,  90.0,      1.5, 0.03,  0.0, 1.0,       1.0,  0.72, 0.58),
    "BMC":   ((0.5, 0.5, 4.0),   "float32", 1.0,    0.55, 1.1,     0.02,  0.2,  0.0,       0.0, 0.06,  0.0, 1.0,       1.1,  0.85, 0.68),
    "HK":    ((0.7, 0.7, 3.6),   "int16",   2500.0, 1.5,  0.9,     0.06,  0.3,  180.0,     0.0, 0.015, 1.0, 2.0,       0.9,  0.62, 0.48),
    "I2CVB": ((0.45, 0.45, 3.2), "float32", 400.0,  0.85, 1.2,     0.0,   0.15, 270.0,     0.0, 0.1,   0.0, 1.0,       1.25, 0.58, 0.66),
    "RUNMC": ((0.6, 0.6, 3.6),   "int16",   1500.0, 1.15, 1.0,     0.03,  0.25, 200.0,     0.0, 0.035, 0.5, 1.25,      1.0,  0.75, 0.55),
    "UCL":   ((0.8, 0.8, 3.5),   "int16",   800.0,  2.2,  0.95,    0.08,  0.6,  315.0,     0.0, 0.01,  0.8, 1.5,       0.8,  0.88, 0.46),
}
PROSTATE_STYLES: dict[str, MRIStyle] = {site: MRIStyle(*row) for site, row in _STYLE_TABLE.items()}


@dataclass(frozen=True)
class ProstateContent:
    """What one site images and how its annotators label it (the patients and the convention, not the scanner).

    Pixel amounts are at size 96 and scale with ``SyntheticConfig.size``. The neutral entry
    (``NEUTRAL_PROSTATE_CONTENT``) is the common distribution every site draws from under ``shift: style_only``.
    """

    gland_scale: float  # multiplies both in-plane semi-axes of the gland (common draw: 0.2-0.3 by 0.16-0.24 of the
    # half field of view)
    elongation: float  # multiplies the left-right / antero-posterior axis ratio, area kept: > 1 flatter, < 1 rounder
    irregularity: float  # multiplies the amplitude of the boundary lobes (common draw: up to 8 %, 6 % and 2 % of the
    # radius for the 2-, 3- and 5-fold ones)
    label_margin: float  # px: > 0 the mask reaches past the gland's outline (dilated), < 0 it stops inside (eroded)
    label_smoothing: float  # px: in-plane Gaussian sigma applied to the mask (a smoothed, spline-like contour)
    label_jag: float  # px: amplitude of a pixel-scale wobble of the mask outline, drawn per slice (a coarse
    # hand-drawn contour)
    apex_cut: float  # share of the gland's half-length at the apex whose slices are left unlabelled (0: all)
    base_cut: float  # the same at the base


NEUTRAL_PROSTATE_CONTENT = ProstateContent(gland_scale=1.0, elongation=1.0, irregularity=1.0, label_margin=0.0,
                                           label_smoothing=0.0, label_jag=0.0, apex_cut=0.0, base_cut=0.0)

# One entry per site; the module docstring tables them. Size and margin do not go together (BIDMC: large and
# generous; UCL: large but tight; I2CVB: small but generous), so gland size alone does not tell a site's labelling
# convention. The spread of gland size in the image (gland_scale x the style's zoom: 0.79 for HK to 1.13 for
# I2CVB) stays within the spread of the styles' zoom alone (0.8 to 1.25), and each convention alone costs a Dice
# of 0.87-0.92 against masks drawn on the outline of the same glands (BMC, the tightest, 0.87; measured at size
# 96): moderate by design. Measured with pooled training on the other five sites (64 px, 40 epochs, 3 seeds), the
# unseen site's Dice falls from 0.87 to 0.79 (RUNMC) and from 0.74 to 0.65 (HK) against style_only.
PROSTATE_CONTENT: dict[str, ProstateContent] = {
    "BIDMC": ProstateContent(gland_scale=1.12, elongation=0.90, irregularity=0.7, label_margin=1.0,
                             label_smoothing=1.5, label_jag=0.0, apex_cut=0.0, base_cut=0.0),
    "BMC": ProstateContent(gland_scale=1.00, elongation=1.20, irregularity=1.0, label_margin=-1.0,
                           label_smoothing=0.0, label_jag=0.8, apex_cut=0.15, base_cut=0.15),
    "HK": ProstateContent(gland_scale=0.88, elongation=1.00, irregularity=1.6, label_margin=0.0,
                          label_smoothing=0.0, label_jag=0.6, apex_cut=0.3, base_cut=0.0),
    "I2CVB": ProstateContent(gland_scale=0.90, elongation=1.15, irregularity=1.4, label_margin=1.0,
                             label_smoothing=0.0, label_jag=0.0, apex_cut=0.0, base_cut=0.2),
    "RUNMC": ProstateContent(gland_scale=1.00, elongation=1.00, irregularity=1.0, label_margin=0.0,
                             label_smoothing=0.8, label_jag=0.0, apex_cut=0.0, base_cut=0.0),
    "UCL": ProstateContent(gland_scale=1.10, elongation=0.85, irregularity=0.6, label_margin=-0.5,
                           label_smoothing=2.0, label_jag=0.0, apex_cut=0.0, base_cut=0.0),
}


def prostate_content(site: str, shift: str) -> ProstateContent:
    """The content and labelling a site draws from: its own entry, or the neutral one under ``style_only``."""
    return site_content(PROSTATE_CONTENT, NEUTRAL_PROSTATE_CONTENT, site, shift)


@dataclass(frozen=True)
class GlandGeometry:
    """Where the imaged gland is, for the annotator: all arrays broadcast against a ``(H, W, S)`` volume.

    ``q``: ``(H, W, S)`` normalised radius, < 1 inside the gland's outline on slices where it is present;
    ``present``: ``(1, 1, S)`` bool, the slice cuts the gland; ``rel_z``: ``(S,)`` slice position along the gland,
    -1 at its apex end and +1 at its base end (beyond those: no gland).
    """

    q: np.ndarray
    present: np.ndarray
    rel_z: np.ndarray


def _soft_ellipse(
    x: np.ndarray,
    y: np.ndarray,
    cx: float,
    cy: float,
    ax: float | np.ndarray,
    ay: float | np.ndarray,
    px_per_unit: float,
    edge: float = 0.6,
) -> np.ndarray:
    """Anti-aliased ellipse membership in [0, 1]; ``edge`` is the edge width in pixels.

    The signed distance is approximated by ``(1 - q) * min(ax, ay)`` with ``q`` the normalised
    radius: exact for circles and close enough at the pixel scale for the mild ellipses used here.
    The semi-axes may be arrays broadcasting against ``x`` (e.g. varying along the slices).
    """
    q = np.sqrt(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2)
    return sigmoid((1.0 - q) * np.minimum(ax, ay) * px_per_unit / edge)


def _prostate_anatomy(
    rng: np.random.Generator, size: int, n_slices: int, style: MRIStyle, content: ProstateContent
) -> tuple[np.ndarray, GlandGeometry]:
    """Tissue signal in [0, ~1], ``(size, size, n_slices)`` float32, and the gland's geometry (for the annotator).

    Coordinates: ``x`` along axis 1 (left-right), ``y`` along axis 0 (anterior at negative ``y``),
    both in [-1, 1] across the image and divided by ``style.zoom``; ``z`` in [-1, 1] from apex to
    base. ``style.fat`` and ``style.pz`` set the sequence's tissue contrast; ``content`` the site's gland size,
    elongation and boundary irregularity.
    """
    zoom = style.zoom
    lin = ((np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0) / zoom
    y, x = np.meshgrid(lin, lin, indexing="ij")
    y, x = y[..., None], x[..., None]
    z = np.linspace(-1.0, 1.0, n_slices, dtype=np.float32) if n_slices > 1 else np.zeros(1, np.float32)
    z = z[None, None, :]
    ppu = size * zoom / 2.0  # pixels per coordinate unit
    px = size / 96.0  # texture scales are defined at size 96
    shape = (size, size, n_slices)
    zs = max(0.5, 1.5 * n_slices / 12.0)  # smoothing along the slices (textures continue across slices)

    def texture(sigma: float) -> np.ndarray:
        return smooth_noise(rng, shape, (sigma * px, sigma * px, zs))

    def u(lo: float, hi: float) -> float:
        return float(rng.uniform(lo, hi))

    # Body outline (slightly varying along z) with subcutaneous fat.
    bx, by = u(0.78, 0.9), u(0.58, 0.7)
    bcx, bcy = u(-0.03, 0.03), u(-0.03, 0.03)
    bscale = 1.0 + 0.04 * z
    body = _soft_ellipse(x, y, bcx, bcy, bx * bscale, by * bscale, ppu, edge=0.7)
    fat_t = u(0.07, 0.12)
    inner = _soft_ellipse(x, y, bcx, bcy, bx * bscale - fat_t, by * bscale - fat_t, ppu, edge=1.2)
    img = body * (style.fat + 0.06 * texture(1.5))  # fat
    soft = 0.38 + 0.06 * texture(6.0) + 0.03 * texture(1.5)
    img = img * (1 - inner) + soft * inner

    # Prostate geometry (needed first so the neighbours are placed around it).
    pcx, pcy = u(-0.06, 0.06), u(0.0, 0.12)
    # The site's gland size and elongation scale the common draw (elongation keeps the area: sqrt on each axis).
    stretch = float(np.sqrt(content.elongation))
    rx = u(0.2, 0.3) * content.gland_scale * stretch
    ry = u(0.16, 0.24) * content.gland_scale / stretch
    rot = u(-0.35, 0.35)
    cz, hz = u(-0.15, 0.15), u(0.55, 0.8)
    irr = content.irregularity
    a2, a3, p2, p3 = u(0.0, 0.08) * irr, u(0.0, 0.06) * irr, u(0, 2 * np.pi), u(0, 2 * np.pi)
    a5, p5 = u(0.0, 0.02) * irr, u(0, 2 * np.pi)

    # Obturator muscles (dark, fibrous) and femoral heads (marrow with dark cortex), left and right.
    for side in (-1.0, 1.0):
        mx = side * (pcx * side + rx + u(0.12, 0.18))
        w = _soft_ellipse(x, y, mx, pcy + u(0.0, 0.08), u(0.07, 0.1), u(0.2, 0.28), ppu) * inner
        img = img * (1 - w) + (0.25 + 0.04 * texture(0.8)) * w
        fr = u(0.13, 0.17) * np.sqrt(np.clip(1.0 - ((z - u(-0.3, 0.1)) / 0.9) ** 2, 0.0, 1.0)) + 1e-3
        fx, fy = side * u(0.6, 0.68), u(-0.12, 0.0)
        cortex = _soft_ellipse(x, y, fx, fy, fr, fr, ppu) * inner
        marrow = _soft_ellipse(x, y, fx, fy, np.maximum(fr - 0.03, 1e-3), np.maximum(fr - 0.03, 1e-3), ppu) * inner
        img = img * (1 - cortex) + 0.1 * cortex
        img = img * (1 - marrow) + (0.55 + 0.05 * texture(1.0)) * marrow

    # Bladder: bright urine anterior to the gland, growing towards the base slices.
    zb = cz + u(0.0, 0.4) * hz
    grow = np.sqrt(np.clip((z - zb) / 0.6, 0.0, 1.0))
    bl_ax, bl_ay = u(0.22, 0.32) * grow + 1e-3, u(0.14, 0.2) * grow + 1e-3
    bl_cy = pcy - ry - bl_ay * 0.6 - 0.05
    wall = _soft_ellipse(x, y, pcx, bl_cy, bl_ax + 0.025, bl_ay + 0.025, ppu) * inner
    urine = _soft_ellipse(x, y, pcx, bl_cy, bl_ax, bl_ay, ppu)
    img = img * (1 - wall) + 0.2 * wall
    img = img * (1 - urine) + (0.86 + 0.02 * texture(3.0)) * urine

    # Rectum behind the gland: dark wall, lumen either gas (very dark) or mixed content.
    rr = u(0.09, 0.13)
    rcx, rcy = pcx + u(-0.04, 0.04), pcy + ry + rr + u(0.02, 0.06)
    rwall = _soft_ellipse(x, y, rcx, rcy, rr * 1.15, rr, ppu)
    lumen = _soft_ellipse(x, y, rcx, rcy, rr * 1.15 - 0.03, rr - 0.03, ppu)
    content = 0.06 if rng.random() < 0.4 else 0.5
    img = img * (1 - rwall) + (0.22 + 0.03 * texture(1.0)) * rwall
    img = img * (1 - lumen) + (content + 0.08 * texture(1.2)) * lumen

    # Prostate: randomly perturbed ellipsoid shrinking towards apex and base.
    taper = np.clip(1.0 - ((z - cz) / hz) ** 2, 0.0, 1.0) ** 0.4  # blunt ends, 0 beyond the extent
    dx, dy = x - pcx, y - pcy
    xr = (np.cos(rot) * dx + np.sin(rot) * dy) / rx
    yr = (-np.sin(rot) * dx + np.cos(rot) * dy) / ry
    rho = np.sqrt(xr**2 + yr**2)
    theta = np.arctan2(yr, xr)
    lobes = a2 * np.cos(2 * theta + p2 + 0.8 * z) + a3 * np.cos(3 * theta + p3) + a5 * np.cos(5 * theta + p5 - z)
    radius = (1.0 + lobes) * taper
    f = rho / np.maximum(radius, 1e-6)  # < 1 inside the gland
    r_px = np.maximum(radius * min(rx, ry) * ppu, 1e-3)  # local gland radius in pixels
    inside = np.where(taper > 0, sigmoid((1.0 - f) * r_px / 0.6), 0.0)

    # Periprostatic fat/venous plexus: bright patches in a band around the gland.
    band = np.where(taper > 0, sigmoid((f - 1.12) * r_px / 0.8) * sigmoid((1.8 - f) * r_px / 2.0), 0.0)
    patches = sigmoid(3.0 * texture(1.3) - 1.0) * band * inner
    img = img * (1 - 0.7 * patches) + 0.85 * style.fat * 0.7 * patches
    # Capsule: a thin dark line just outside the boundary.
    capsule = np.where(taper > 0, np.exp(-(((f - 1.06) * r_px / 0.8) ** 2)), 0.0)
    img = img - 0.16 * capsule * inner
    # Zones: nodular central gland, brighter and finer peripheral zone at the back and sides.
    pz = sigmoid((f - 0.62) * r_px / 1.0) * sigmoid((yr + 0.25) * 6.0)
    gland = (1 - pz) * (0.4 + 0.09 * texture(1.0)) + pz * (style.pz + 0.05 * texture(0.6))
    img = img * (1 - inside) + gland * inside
    rel_z = ((z - cz) / hz).reshape(-1)
    geometry = GlandGeometry(q=f.astype(np.float32), present=taper > 0, rel_z=rel_z)
    return np.clip(img, 0.0, None).astype(np.float32), geometry


def _annotate_prostate(geometry: GlandGeometry, content: ProstateContent, rng: np.random.Generator) -> np.ndarray:
    """The site's mask of the imaged gland, ``(H, W, S)`` uint8 (1 = prostate), by its labelling convention.

    Margin, smoothing and jag act in-plane on each slice (annotators contour slice by slice); the apex and base
    cuts leave the end slices of the gland unlabelled, but never the slice through the gland's centre, so that a
    volume keeps a label at any ``slices_per_case``. ``rng``: the case's annotator generator (``label_rng``).
    """
    q = geometry.q
    size = q.shape[0]
    px = size / 96.0
    jitter = None
    if content.label_jag > 0:
        # Independent per slice (no smoothing along z) and about a pixel wide in-plane: a hand-drawn wobble.
        jitter = content.label_jag * px * smooth_noise(rng, q.shape, (0.8 * px, 0.8 * px, 0.0))
    mask = annotate(signed_distance_px(q), content.label_margin, content.label_smoothing, px, jitter)
    rel = geometry.rel_z
    labelled = (rel >= -1.0 + content.apex_cut) & (rel <= 1.0 - content.base_cut)
    labelled[int(np.argmin(np.abs(rel)))] = True
    return (mask & geometry.present & labelled[None, None, :]).astype(np.uint8)


def _acquire_mri(tissue: np.ndarray, style: MRIStyle, rng: np.random.Generator) -> np.ndarray:
    """Apply a site's acquisition style to a tissue signal ``(H, W, S)``; returns float32 signal >= 0."""
    size = tissue.shape[0]
    # A little per-case jitter so that a site is a distribution of styles, not one fixed style.
    gamma = style.gamma * float(rng.uniform(0.95, 1.05))
    angle = np.deg2rad(style.bias_angle + float(rng.uniform(-15, 15)))
    bias = style.bias * float(rng.uniform(0.85, 1.15))
    sigma = style.noise * float(rng.uniform(0.9, 1.1))

    sig = style.offset + style.contrast * np.clip(tissue, 0.0, 1.2) ** gamma
    lin = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0
    yy, xx = np.meshgrid(lin, lin, indexing="ij")
    field = np.exp(bias * (np.cos(angle) * xx + np.sin(angle) * yy))
    if style.coil > 0:  # the rectum lies about 0.35 * zoom below the image centre
        field = field * (1.0 + style.coil * np.exp(-(xx**2 + (yy - 0.35 * style.zoom) ** 2) / (2 * 0.22**2)))
    sig = sig * field[..., None]

    def rician(a: np.ndarray) -> np.ndarray:
        # MRI magnitude images: |signal + complex Gaussian noise| (Rayleigh-distributed in the air).
        n1 = rng.standard_normal(a.shape).astype(np.float32) * sigma
        n2 = rng.standard_normal(a.shape).astype(np.float32) * sigma
        return np.sqrt((a + n1) ** 2 + n2**2)

    out = degrade(sig.astype(np.float32), style.blur, style.downsample, rician, size / 96.0)
    return np.clip(out, 0.0, None).astype(np.float32)


def _nifti_bytes(data: np.ndarray, spacing: Sequence[float]) -> bytes:
    """Gzipped NIfTI-1 bytes with a fixed header: qform = sform = scaled identity, centred, mm units."""
    affine = np.diag([*map(float, spacing), 1.0])
    affine[:3, 3] = [-(n * s) / 2.0 for n, s in zip(data.shape, spacing)]
    img = nib.Nifti1Image(data, affine)
    img.set_data_dtype(data.dtype)
    img.header.set_xyzt_units("mm")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    # nibabel's own .nii.gz writer stores the write time in the gzip header; gzip.compress with
    # mtime=0 (and no file name) makes the bytes depend on the data alone.
    return gzip.compress(img.to_bytes(), compresslevel=6, mtime=0)


def _write_nifti(path: Path, data: np.ndarray, spacing: Sequence[float]) -> None:
    write_bytes(path, _nifti_bytes(data, spacing))


def generate_prostate_site(out_dir: Path, site: str, cfg: SyntheticConfig) -> None:
    """Write ``cfg.cases_per_site`` volumes and masks of ``site`` into ``out_dir / site`` (SAML layout)."""
    style = PROSTATE_STYLES[site]
    content = prostate_content(site, cfg.shift)
    mask_suffix = "_Segmentation" if site == "BMC" else "_segmentation"
    width = max(2, len(str(cfg.cases_per_site - 1)))
    site_index = PROSTATE_SITES.index(site)
    for case in range(cfg.cases_per_site):
        rng = case_rng(cfg.seed, "prostate", site_index, case)
        tissue, geometry = _prostate_anatomy(rng, cfg.size, cfg.slices_per_case, style, content)
        mask = _annotate_prostate(geometry, content, label_rng(cfg.seed, "prostate", site_index, case))
        sig = _acquire_mri(tissue, style, rng) * style.scale
        if style.dtype == "int16":
            image = np.clip(np.rint(sig), 0, np.iinfo(np.int16).max).astype(np.int16)
        else:
            image = sig.astype(np.float32)
        name = f"Case{case:0{width}d}"
        _write_nifti(out_dir / site / f"{name}.nii.gz", image, style.spacing)
        _write_nifti(out_dir / site / f"{name}{mask_suffix}.nii.gz", mask, style.spacing)
