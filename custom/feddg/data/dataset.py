"""Loading a site into memory as normalised 2D slices, split into train / val / test.

One layout-independent core serves the three on-disk layouts: :mod:`feddg.data.layouts` finds and decodes the
files, this module crops, resizes, normalises, splits case-level and drops empty training slices.

Preprocessing choices (the papers leave them open or describe them in one sentence):

* MRI (``saml_nifti``, ``slice_png``): the papers "normalize the data individually to zero mean and unit variance";
  we z-score each volume (``cfg.zscore == "volume"``) or each slice (``"slice"``). A ``slice_png`` record is a single
  slice, so it is always z-scored per slice. A constant image (zero std) is only centred.
* Fundus (``dofe_png``): centre-crop to a square (the papers crop an 800x800 disc region), resize, then scale each
  channel from 0..255 to [-1, 1]; no per-image statistics, so colour differences between sites are kept.
* Order: crop -> resize -> normalise, so the network input is exactly zero-mean/unit-variance (and cheaper: the
  statistics are computed on the small image).
* Resizing uses torch (batched over all slices of a volume, much faster than per-slice scikit-image):
  bilinear with antialiasing for images (area-like when shrinking) and ``nearest-exact`` for labels, so labels stay
  binary and, for fundus, disc ⊇ cup is preserved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from feddg.layouts import Layout

from ..config import DataConfig
from ..seeds import split_seed
from .errors import DataError, DataWarning
from .layouts import CaseRecord, Decoded, discover_site, foreground_warnings, layout_spec, read_record

SPLITS = ("train", "val", "test")

logger = logging.getLogger(__name__)


@dataclass
class SliceSet:
    """The 2D samples of one site and split, held in memory.

    Attributes:
        site: the site name.
        images: (N, C, S, S) float32, normalised, resized to ``cfg.image_size``.
        labels: (N, L, S, S) uint8 in {0, 1}; L = len(cfg.label_names): (prostate,) or (disc, cup).
        case_ids: N case ids. Layouts with split folders qualify them with the folder (``"train/00"``,
            ``"test/00"``): the public layouts reuse names across train/ and test/, and the unseen site merges both.
        slice_index: (N,) int64 axial index of each slice inside its volume (0 for single images).
        spacing: case id -> (row, col, slice) mm per pixel at network resolution (in-plane spacing scaled by
            original/new size, slice spacing unchanged); None for PNG layouts (distances are then in pixels).
    """

    site: str
    images: np.ndarray
    labels: np.ndarray
    case_ids: list[str]
    slice_index: np.ndarray
    spacing: dict[str, tuple[float, float, float]] | None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def case_indices(self) -> dict[str, np.ndarray]:
        """Case id -> row indices of its slices, in slice order; cases in order of first appearance."""
        rows: dict[str, list[int]] = {}
        for i, c in enumerate(self.case_ids):
            rows.setdefault(c, []).append(i)
        out = {}
        for c, idx in rows.items():
            a = np.asarray(idx, dtype=np.int64)
            out[c] = a[np.argsort(self.slice_index[a], kind="stable")]
        return out

    def subset(self, idx: np.ndarray | Sequence[int]) -> SliceSet:
        """The rows ``idx`` (integer indices or a boolean mask of length N) as a new SliceSet (copied arrays)."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False)
        case_ids = [self.case_ids[i] for i in idx]
        spacing = None if self.spacing is None else {c: self.spacing[c] for c in dict.fromkeys(case_ids)}
        return SliceSet(self.site, self.images[idx], self.labels[idx], case_ids, self.slice_index[idx], spacing)

    @classmethod
    def empty(cls, site: str, channels: int, n_labels: int, size: int, volumes: bool) -> SliceSet:
        """A SliceSet with no rows but the right trailing shapes."""
        return cls(
            site,
            np.zeros((0, channels, size, size), np.float32),
            np.zeros((0, n_labels, size, size), np.uint8),
            [],
            np.zeros(0, np.int64),
            {} if volumes else None,
        )


# ------------------------------------------------------------------------------------------------ preprocessing


def crop_square(a: np.ndarray) -> np.ndarray:
    """Centre-crop the last two axes of (..., H, W) to (..., m, m) with m = min(H, W)."""
    h, w = a.shape[-2:]
    m = min(h, w)
    top, left = (h - m) // 2, (w - m) // 2
    return a[..., top : top + m, left : left + m]


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """(n, C, H, W) float32 -> (n, C, size, size) float32, bilinear with antialiasing (area-like when shrinking)."""
    if x.shape[-2:] == (size, size):
        return np.ascontiguousarray(x, dtype=np.float32)
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False, antialias=True).numpy()


def resize_labels(y: np.ndarray, size: int) -> np.ndarray:
    """(n, L, H, W) bool/uint8 -> (n, L, size, size) uint8 in {0, 1}, nearest neighbour (pixel-centre aligned)."""
    y = np.ascontiguousarray(y, dtype=np.uint8)
    if y.shape[-2:] == (size, size):
        return y
    return F.interpolate(torch.from_numpy(y), size=(size, size), mode="nearest-exact").numpy()


def zscore(x: np.ndarray, per_slice: bool) -> np.ndarray:
    """(n, C, H, W) -> zero mean, unit std over the whole array (a volume) or over each slice; zero std: centred."""
    axes = tuple(range(1, x.ndim)) if per_slice else None
    mean = x.mean(axis=axes, keepdims=True, dtype=np.float64)
    std = x.std(axis=axes, keepdims=True, dtype=np.float64)
    std = np.where(std < 1e-6, 1.0, std)
    return ((x - mean) / std).astype(np.float32)


def unit_range(x: np.ndarray) -> np.ndarray:
    """8-bit intensities 0..255 -> [-1, 1], each channel the same way."""
    return (x * (2.0 / 255.0) - 1.0).astype(np.float32)


def preprocess(
    d: Decoded, spec: Layout, size: int, zscore_mode: str
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float] | None]:
    """One decoded record -> (images (n, C, S, S) float32, labels (n, L, S, S) uint8, spacing at size S or None)."""
    image, labels = d.image, d.labels
    if spec.square_crop:
        image, labels = crop_square(image), crop_square(labels)
    h, w = image.shape[-2:]
    image = resize_images(image, size)
    labels = resize_labels(labels, size)
    if spec.intensity == "zscore":
        image = zscore(image, per_slice=zscore_mode == "slice")
    else:
        image = unit_range(image)
    spacing = None
    if d.spacing is not None:
        spacing = (d.spacing[0] * h / size, d.spacing[1] * w / size, d.spacing[2])
    return image, labels, spacing


# ------------------------------------------------------------------------------------------------ splitting


def split_cases(case_ids: Sequence[str], val_fraction: float, seed: int, site: str) -> tuple[list[str], list[str]]:
    """Case-level train/val split: (train cases, val cases), both sorted.

    ``round(val_fraction * n)`` cases go to validation, at least one when ``val_fraction > 0`` and there are at least
    two cases, and never all of them. The draw depends on ``seed`` and the site name only.
    """
    cases = sorted(set(case_ids))
    n = len(cases)
    n_val = 0
    if val_fraction > 0 and n >= 2:
        n_val = min(max(1, round(val_fraction * n)), n - 1)
    order = np.random.default_rng(split_seed(seed, site)).permutation(n)
    val = sorted(cases[i] for i in order[:n_val])
    train = sorted(cases[i] for i in order[n_val:])
    return train, val


def assign_splits(records: list[CaseRecord], cfg: DataConfig, site: str) -> dict[str, list[CaseRecord]]:
    """Records per split. Training site: train folder (or everything, without split folders) split case-level into
    train/val, test folder -> test. Unseen site: everything -> test."""
    if site == cfg.unseen_site:
        return {"train": [], "val": [], "test": list(records)}
    pool = [r for r in records if r.split in (None, "train")]
    _, val_cases = split_cases([r.case_id for r in pool], cfg.val_fraction, cfg.split_seed, site)
    val_set = set(val_cases)
    return {
        "train": [r for r in pool if r.case_id not in val_set],
        "val": [r for r in pool if r.case_id in val_set],
        "test": [r for r in records if r.split == "test"],
    }


# ------------------------------------------------------------------------------------------------ loading


def _qualified_case_id(rec: CaseRecord) -> str:
    return rec.case_id if rec.split is None else f"{rec.split}/{rec.case_id}"


def build_slice_set(records: list[CaseRecord], cfg: DataConfig, spec: Layout, site: str) -> SliceSet:
    """Decode, validate and preprocess ``records`` into one SliceSet (rows grouped by case, in record order)."""
    n_labels = len(cfg.label_names)
    if not records:
        return SliceSet.empty(site, spec.channels, n_labels, cfg.image_size, spec.volumes)
    images, labels, case_ids, slices = [], [], [], []
    spacing: dict[str, tuple[float, float, float]] | None = {} if spec.volumes else None
    for rec in records:
        d = read_record(spec.name, rec)
        _log_warnings(d.warnings)
        img, lab, sp = preprocess(d, spec, cfg.image_size, cfg.zscore)
        cid = _qualified_case_id(rec)
        images.append(img)
        labels.append(lab)
        slices.append(d.slice_index)
        case_ids += [cid] * img.shape[0]
        if spacing is not None and sp is not None:
            spacing[cid] = sp
    return SliceSet(
        site,
        np.concatenate(images),
        np.concatenate(labels),
        case_ids,
        np.concatenate(slices).astype(np.int64),
        spacing,
    )


def _log_warnings(warnings: list[DataWarning]) -> None:
    for w in warnings:
        logger.warning("suspicious data: %s", w)


def _warn_implausible_foreground(out: dict[str, SliceSet], cfg: DataConfig, site: str) -> None:
    """Log the data check's foreground warning for each split (see :func:`feddg.data.layouts.foreground_warnings`)."""
    for split, s in out.items():
        if len(s):
            share = s.labels.mean(axis=(0, 2, 3), dtype=np.float64)
            _log_warnings(foreground_warnings(cfg.layout, site, split, dict(zip(cfg.label_names, share.tolist()))))


def drop_empty(s: SliceSet) -> SliceSet:
    """Only the slices with some foreground in any label channel."""
    return s.subset(s.labels.any(axis=(1, 2, 3)))


def resolve_root(cfg: DataConfig) -> Path:
    """``cfg.root``, or the synthetic data set (generated into the cache on first use) when it is None."""
    if cfg.root is not None:
        return Path(cfg.root).expanduser()
    from .synthetic import ensure_synthetic  # lazily: only needed without real data

    return Path(ensure_synthetic(cfg))


def load_site(cfg: DataConfig, site: str) -> dict[str, SliceSet]:
    """Load one site: ``{"train", "val", "test"}`` -> SliceSet (all three keys, possibly empty).

    Raises DataError before returning anything for: an unknown site, a layout that does not match the task, any
    discovery problem (missing folders, unpaired files, symbolic links that cannot be followed, folders or files the
    OS refuses to read) and any decoding problem (see :func:`feddg.data.layouts.read_record`: corrupt file, shape or
    geometry mismatch, mask values outside the encoding, NaN/Inf voxels, ...).

    Logs a warning (logger ``feddg.data.dataset``) naming the site for suspicious but usable data: a split whose
    foreground share is implausible for the task (an inverted mask), an image reduced from above the size cap.
    """
    if site not in cfg.sites:
        raise DataError(f"unknown site {site!r}; the configured sites are {list(cfg.sites)}", site=site)
    spec = layout_spec(cfg.layout)
    if spec.task != cfg.task:
        raise DataError(
            f"layout {cfg.layout!r} holds {spec.task} data but the task is {cfg.task!r}", site=site
        )
    root = resolve_root(cfg)
    records = discover_site(cfg.layout, root, site)
    groups = assign_splits(records, cfg, site)
    out = {name: build_slice_set(groups[name], cfg, spec, site) for name in SPLITS}
    _warn_implausible_foreground(out, cfg, site)
    if not cfg.train_empty_slices:
        out["train"] = drop_empty(out["train"])  # evaluation keeps every slice
    return out


# ------------------------------------------------------------------------------------------------ torch


class SliceDataset(torch.utils.data.Dataset):
    """A SliceSet as a map-style dataset of {"image": (C, S, S), "label": (L, S, S)} float tensors."""

    def __init__(self, s: SliceSet) -> None:
        self.s = s

    def __len__(self) -> int:
        return len(self.s)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": torch.from_numpy(self.s.images[i]),
                "label": torch.from_numpy(self.s.labels[i].astype(np.float32))}


class TrainBatches:
    """One round's training batches of a site, on the training device: {"image": (B, C, S, S), "label":
    (B, L, S, S)} float tensors, augmented there when asked (:mod:`feddg.data.transforms`).

    Each iteration is one epoch in a new shuffled order. Deterministic given ``seed``: the order and the
    augmentation draws both derive from it, whatever the device.

    The site's data is already decoded in memory, so a batch is a gather of rows: no DataLoader workers (the
    augmentation, the only costly step, runs batched on the device); host memory is pinned for the copy to a GPU.
    """

    def __init__(self, s: SliceSet, batch_size: int, shuffle: bool, augment: bool, seed: int,
                 device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        generator = torch.Generator().manual_seed(seed)
        self.loader = torch.utils.data.DataLoader(
            SliceDataset(s), batch_size=batch_size, shuffle=shuffle, num_workers=0, generator=generator,
            pin_memory=self.device.type == "cuda",
        )
        self.seconds = 0.0  # time spent producing batches so far (the host's share on a GPU)
        self.augmentation = None
        if augment:
            from .transforms import BatchAugmentation  # lazily: MONAI is only needed for training

            self.augmentation = BatchAugmentation(seed)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = iter(self.loader)
        while True:
            started = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return
            image = batch["image"].to(self.device, non_blocking=True)
            label = batch["label"].to(self.device, non_blocking=True)
            if self.augmentation is not None:
                image, label = self.augmentation(image, label)
            self.seconds += time.perf_counter() - started
            yield {"image": image, "label": label}


def make_loader(s: SliceSet, batch_size: int, shuffle: bool, augment: bool, seed: int,
                device: torch.device | str = "cpu") -> TrainBatches:
    """The batches of ``s`` for one round of training (:class:`TrainBatches`)."""
    return TrainBatches(s, batch_size, shuffle, augment, seed, device)
