"""Using a trained global model outside the federation: evaluation on a labelled folder, and segmentation of
unlabeled NIfTI scans written back in each scan's own geometry.

A checkpoint saved by a job (``FL_global_model.pt`` / ``best_FL_global_model.pt``) holds the weights and, in
``train_conf``, the job's whole ``feddg.yaml``: the network and its preprocessing are rebuilt from the file alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from feddg.config import FedDGConfig, config_from_dict
from feddg.data.dataset import SliceSet, load_site, preprocess
from feddg.data.layouts import Decoded, layout_spec
from feddg.evaluation import evaluate_sliceset, predict_logits
from feddg.metrics import largest_connected_component
from feddg.nets.unet import build_model, select_device
from feddg.report import format_table, site_rows

NIFTI_SUFFIXES = (".nii.gz", ".nii")


def load_checkpoint(path: Path, device: torch.device | None = None) -> tuple[torch.nn.Module, FedDGConfig]:
    """The network of a saved global model, in eval mode, and the configuration it was trained with."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, not a torch checkpoint, ...
        raise ValueError(f"{path}: cannot read the model checkpoint ({type(e).__name__}: {e})") from e
    try:
        raw_cfg = saved["train_conf"]["train"]["feddg_config"]
        state = saved["model"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a FedDG checkpoint (no 'model' weights with a 'train_conf.train.feddg_config')") from e
    cfg = config_from_dict(raw_cfg)
    model = build_model(cfg)
    try:
        model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: the weights do not fit the network in its own configuration: {e}") from e
    return model.to(device or select_device()).eval(), cfg


# ---------------------------------------------------------------------------------------------- evaluation
def evaluate_folder(
    model_path: Path | None,
    data_root: Path,
    sites: list[str],
    layout: str | None = None,
    overlays_dir: Path | None = None,
    json_path: Path | None = None,
    largest_component: bool = False,
    bundle_path: Path | None = None,
) -> int:
    """Score a saved global model (``model_path``), an MLA bundle (``bundle_path``) or both, side by side, on every
    image of each site folder (each treated as an unseen site); print the metrics table, optionally write PNG
    overlays (of the global model) and a JSON file. Returns a process exit code.

    With a bundle, MLA's application phase runs on each site's images: the attention weights D^w come from the
    site's own images (the bundle's mode, "mean" by default: one combined model per site), Eq. (4) combines the
    local models, and the combination is scored like the global model (rows of model ``mla``)."""
    from feddg.mla_bundle import evaluate_with_bundle, load_bundle

    if model_path is None and bundle_path is None:
        raise ValueError("nothing to evaluate: give --model, --bundle or both")
    device = select_device()
    model, cfg = load_checkpoint(model_path, device) if model_path is not None else (None, None)
    bundle = load_bundle(bundle_path) if bundle_path is not None else None
    rows, results, weights = [], {}, {}
    for site in sites:
        loaded: dict = {}

        def test_of(c: FedDGConfig) -> SliceSet:
            site_cfg = type(c.data).model_validate({**c.data.model_dump(), "root": str(data_root),
                                                    "layout": layout or c.data.layout, "sites": [site],
                                                    "unseen_site": site})
            key = repr(site_cfg)  # the global model and the bundle share the data when they share preprocessing
            if key not in loaded:
                loaded[key] = load_site(site_cfg, site)["test"]
            return loaded[key]

        if model is not None:
            test = test_of(cfg)
            out = evaluate_sliceset(model, test, cfg.data.label_names, device, cfg.eval.batch_size,
                                    largest_component or cfg.eval.largest_component)
            results[site] = out
            rows.extend(site_rows("global", site, "unseen", {"test": out["summary"]}, cfg.data.label_names))
            if overlays_dir is not None:
                logits = predict_logits(model, test.images, device, cfg.eval.batch_size)
                write_overlays(test, logits > 0, overlays_dir / site)
        if bundle is not None:
            bcfg = bundle.config
            metrics, info = evaluate_with_bundle(
                bundle, {"test": test_of(bcfg)}, "test", device, bcfg.eval.batch_size,
                largest_component or bcfg.eval.largest_component,
            )
            weights[site] = info
            rows.extend(site_rows("mla", site, "unseen", metrics, bcfg.data.label_names))
    print(format_table(rows))
    for site, info in weights.items():
        print(f"MLA attention weights at {site} ({info['mode']}, from {info['n_images']} images): "
              + ", ".join(f"{s} {w:.3f}" for s, w in info["weights"].items()))
    if json_path is not None:
        json_path.write_text(json.dumps({"model": str(model_path) if model_path else None,
                                         "bundle": str(bundle_path) if bundle_path else None,
                                         "table": rows, "sites": results, "mla_weights": weights}, indent=2))
    return 0


def write_overlays(s: SliceSet, pred: np.ndarray, out_dir: Path) -> list[Path]:
    """One RGB PNG per image: the (first channel of the) image in grey, ground-truth contours in green,
    predicted contours in red, where they coincide yellow. ``pred``: (N, L, H, W) bool."""
    from PIL import Image
    from skimage.segmentation import find_boundaries

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(len(s)):
        img = s.images[i]
        grey = img.mean(axis=0)
        lo, hi = np.percentile(grey, (1, 99))
        grey = np.clip((grey - lo) / max(hi - lo, 1e-6), 0, 1)
        rgb = np.repeat((grey * 255).astype(np.uint8)[..., None], 3, axis=-1)
        for l in range(pred.shape[1]):
            gt_edge = find_boundaries(s.labels[i, l].astype(bool), mode="inner")
            pr_edge = find_boundaries(pred[i, l], mode="inner")
            rgb[gt_edge, 1] = 255
            rgb[pr_edge, 0] = 255
            rgb[pr_edge & ~gt_edge, 1] = 0
            rgb[gt_edge & ~pr_edge, 0] = 0
        # PNG layouts qualify case ids with their folder ("train/00"): keep that in the name, not as a path.
        path = out_dir / f"{s.case_ids[i].replace('/', '_')}_{int(s.slice_index[i]):03d}.png"
        Image.fromarray(rgb).save(path)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------- segmentation
def segment_volume(
    predict: Callable[[np.ndarray], np.ndarray], volume_canonical: np.ndarray, zooms: tuple[float, float, float],
    cfg: FedDGConfig,
) -> np.ndarray:
    """Segment one volume given in closest-canonical voxel order (X, Y, Z).

    The model's preprocessing (axial slicing, resize to the network size, z-score) is the training loader's
    own (:func:`feddg.data.dataset.preprocess`); it is undone by resizing the logits back to (X, Y) bilinearly
    before thresholding. ``predict`` maps images (n, C, S, S) to logits (n, L, S, S).
    Returns an (X, Y, Z) uint8 label map: 0 background, l + 1 for structure l (later structures win, so the
    fundus cup is drawn over the disc).
    """
    x, y, z = volume_canonical.shape
    slices = np.moveaxis(volume_canonical.astype(np.float32), 2, 0)[:, None]  # (Z, 1, X, Y)
    decoded = Decoded(image=slices, labels=np.zeros((z, len(cfg.data.label_names), x, y), bool),
                      slice_index=np.arange(z), spacing=zooms, shape=(x, y, z))
    images, _, _ = preprocess(decoded, layout_spec("saml_nifti"), cfg.data.image_size, cfg.data.zscore)
    logits = torch.from_numpy(predict(images))
    logits = torch.nn.functional.interpolate(logits, size=(x, y), mode="bilinear", align_corners=False)
    masks = (logits > 0).numpy()  # (Z, L, X, Y)
    if cfg.eval.largest_component:
        masks = np.moveaxis(largest_connected_component(np.moveaxis(masks, 0, -1)), -1, 0)
    labels = np.zeros((z, x, y), np.uint8)
    for l in range(masks.shape[1]):
        labels[masks[:, l]] = l + 1
    return np.moveaxis(labels, 0, 2)


def segment_nifti(predict: Callable[[np.ndarray], np.ndarray], in_path: Path, out_path: Path, cfg: FedDGConfig) -> Path:
    """Segment one NIfTI scan and write the mask with the scan's own affine, orientation and size."""
    import nibabel as nib

    try:
        original = nib.load(str(in_path))
        canonical = nib.as_closest_canonical(original)
        volume = canonical.get_fdata(dtype=np.float32)
    except Exception as e:
        raise ValueError(f"{in_path}: cannot read the scan ({type(e).__name__}: {e})") from e
    if volume.ndim != 3 or not np.isfinite(volume).all():
        raise ValueError(f"{in_path}: expected a finite 3D volume, got shape {volume.shape}")
    zooms = tuple(float(v) for v in canonical.header.get_zooms()[:3])
    labels_canonical = segment_volume(predict, volume, zooms, cfg)
    # Undo the reorientation: canonical (RAS) voxel order back to the scan's own axes.
    to_original = nib.orientations.ornt_transform(
        nib.orientations.io_orientation(canonical.affine), nib.orientations.io_orientation(original.affine)
    )
    labels = nib.orientations.apply_orientation(labels_canonical, to_original).astype(np.uint8)
    header = original.header.copy()
    header.set_data_dtype(np.uint8)
    header.set_slope_inter(1, 0)
    out = nib.Nifti1Image(labels, original.affine, header)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(out, str(out_path))
    return out_path


def _scan_paths(inputs: list[Path]) -> list[Path]:
    paths = []
    for p in inputs:
        if p.is_dir():
            paths.extend(sorted(q for q in p.iterdir() if q.name.endswith(NIFTI_SUFFIXES)))
        elif p.name.endswith(NIFTI_SUFFIXES):
            paths.append(p)
        else:
            raise ValueError(f"{p}: not a NIfTI file (.nii or .nii.gz) or a folder of them")
    if not paths:
        raise ValueError(f"no NIfTI scans found in {[str(p) for p in inputs]}")
    return paths


def segment_scans(model_path: Path, inputs: list[Path], out_dir: Path, largest_component: bool = False) -> int:
    """``feddg segment``: masks as ``<out_dir>/<scan>_mask.nii.gz``. Returns a process exit code."""
    device = select_device()
    model, cfg = load_checkpoint(model_path, device)
    if cfg.data.task != "prostate":
        raise ValueError(f"{model_path}: NIfTI segmentation is for MRI models; this one is a {cfg.data.task} model")
    if largest_component:
        cfg.eval.largest_component = True

    def predict(images: np.ndarray) -> np.ndarray:
        return predict_logits(model, images, device, cfg.eval.batch_size)

    for path in _scan_paths(inputs):
        stem = path.name[: -len(".nii.gz")] if path.name.endswith(".nii.gz") else path.stem
        out = segment_nifti(predict, path, out_dir / f"{stem}_mask.nii.gz", cfg)
        print(f"{path} -> {out}")
    return 0

