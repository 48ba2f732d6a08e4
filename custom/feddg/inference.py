"""Using a trained global model outside the federation: evaluation on a labelled folder, and segmentation of
unlabeled NIfTI scans written back in each scan's own geometry.

A checkpoint saved by a job (``FL_global_model.pt`` / ``best_FL_global_model.pt``) holds the weights and, in
``train_conf``, the job's whole ``feddg.yaml``: the network and its preprocessing are rebuilt from the file alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from feddg.config import ConfigError, FedDGConfig
from feddg.data.dataset import SliceSet, load_site, preprocess
from feddg.data.layouts import Decoded, layout_spec, read_nifti, saml_mask_case
from feddg.evaluation import evaluate_sliceset, predict_logits
from feddg.experiment import experiment_from_dict
from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections
from feddg.flare.updates import UpdateRejected, check_update
from feddg.folders import claim
from feddg.jsonfile import write_json
from feddg.metrics import largest_connected_component
from feddg.nets.unet import build_model, select_device
from feddg.report import format_table, site_rows

NIFTI_SUFFIXES = (".nii.gz", ".nii")


@dataclass(frozen=True)
class Checkpoint:
    """A saved global model that passed every check of :func:`read_checkpoint`.

    Attributes:
        model: the network of the stored configuration with the saved weights, on the CPU, in eval mode.
        config: the configuration the model was trained with (the job's ``feddg.yaml``, stored in ``train_conf``).
        meta: what the workflow stored with the weights (``meta_props``; the round and run behind the model, see
            :mod:`feddg.flare.controller`); empty when the file holds none.
    """

    model: torch.nn.Module
    config: FedDGConfig
    meta: Mapping[str, Any]


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and check a checkpoint saved by a job: a PyTorch file with the weights under ``model`` and a valid
    configuration under ``train_conf.train.feddg_config``, whose network the weights fit exactly (same parameter
    names and shapes, only finite values: :func:`feddg.flare.updates.check_update`, the check a site's update
    passes). Raises ValueError naming the file and the first thing that is wrong."""
    path = Path(path)
    saved = _read_torch_file(path)
    state = saved.get("model") if isinstance(saved, Mapping) else None
    try:
        raw_cfg = saved["train_conf"]["train"]["feddg_config"]
    except (KeyError, TypeError):
        raw_cfg = None
    if not isinstance(state, Mapping) or raw_cfg is None:
        raise ValueError(f"{path}: not a FedDG checkpoint (no 'model' weights with a "
                         f"'train_conf.train.feddg_config'); give a FL_global_model.pt saved by a job")
    try:
        cfg = experiment_from_dict(raw_cfg)
    except ConfigError as e:
        raise ValueError(f"{path}: the configuration stored in the checkpoint is not valid: {e}") from None
    model = build_model(cfg)
    try:
        check_update(state, model.state_dict(), against="the network of its stored configuration")
    except UpdateRejected as e:
        raise ValueError(f"{path}: the weights do not fit: {e}") from None
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    meta = saved.get("meta_props")
    return Checkpoint(model.eval(), cfg, dict(meta) if isinstance(meta, Mapping) else {})


def load_checkpoint(path: Path, device: torch.device | None = None) -> tuple[torch.nn.Module, FedDGConfig]:
    """The network of a saved global model, in eval mode on ``device`` (default: :func:`select_device`), and the
    configuration it was trained with. Raises ValueError as :func:`read_checkpoint` does."""
    checkpoint = read_checkpoint(path)
    return checkpoint.model.to(device or select_device()), checkpoint.config


_TORCH_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive (PyTorch >= 1.6)
_PICKLE_MAGIC = b"\x80"  # ... or, in the legacy format, a pickle (protocol 2 or later)


def _read_torch_file(path: Path) -> Any:
    """The object a ``torch.save`` file holds, loaded with ``weights_only`` (plain data and tensors, no code).
    ValueError naming the file when it is missing, empty, not written by ``torch.save`` or damaged."""
    if not path.is_file():
        raise ValueError(f"{path}: {'is a folder, not' if path.is_dir() else 'no such file; expected'} "
                         f"a model checkpoint file")
    with path.open("rb") as f:
        head = f.read(8)
    if not head:
        raise ValueError(f"{path}: the file is empty (0 bytes), not a model checkpoint")
    if not head.startswith((_TORCH_ZIP_MAGIC, _PICKLE_MAGIC)):
        raise ValueError(f"{path}: not a PyTorch checkpoint (the file starts with {head!r}, not with the zip "
                         f"archive torch.save writes)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged archive raises whatever its reader meets first
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{path}: cannot read the model checkpoint, the file is damaged or incomplete "
                         f"({type(e).__name__}: {first_line})") from None


# ---------------------------------------------------------------------------------------------- evaluation
def evaluate_folder(
    model_path: Path | None,
    data_root: Path,
    sites: list[str],
    layout: str | None = None,
    overlays_dir: Path | None = None,
    json_path: Path | None = None,
    largest_component: bool = False,
    saved_models: Mapping[str, Path] | None = None,
) -> int:
    """Score a saved global model (``model_path``), the models the methods save beside it (``saved_models``: name ->
    path, e.g. ``{"mla": bundle}``: :class:`feddg.flare.method_spec.SavedModel`) or both, side by side, on every
    image of each site folder (each treated as an unseen site); print the metrics table, optionally write PNG
    overlays (of the global model) and a JSON file (``info``: what each saved model reports per site, e.g. MLA's
    attention weights).

    The sites are scored one by one: a site whose data cannot be read or scored does not stop the others. Every
    good site is in the table and the JSON; the failed ones are listed at the end (on stderr, and in the JSON as
    ``failed_sites``: site -> reason). Returns the process exit code: 0, or 1 when a site failed. A model or
    bundle that cannot be loaded is a ValueError before any site is scored.

    With MLA's bundle, MLA's application phase runs on each site's images: the attention weights D^w come from the
    site's own images (the bundle's mode, "mean" by default: one combined model per site), Eq. (4) combines the
    local models, and the combination is scored like the global model (rows of model ``mla``)."""
    import importlib

    from feddg.flare.registry import saved_models as declared

    saved_models = dict(saved_models or {})
    if model_path is None and not saved_models:
        raise ValueError("nothing to evaluate: give --model, "
                         + ", ".join(m.option for m in declared()) + " or several of them")
    scorers = {}
    for m in declared():
        if m.name in saved_models:
            module, _, function = m.scorer.partition(":")
            scorers[m.name] = getattr(importlib.import_module(module), function)(saved_models.pop(m.name))
    if saved_models:
        raise ValueError(f"no method saves a model named {sorted(saved_models)}; known: {[m.name for m in declared()]}")
    device = select_device()
    model, cfg = load_checkpoint(model_path, device) if model_path is not None else (None, None)
    rows, results, infos, failed = [], {}, {name: {} for name in scorers}, {}
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

        # This site's rows, metrics and attention weights, kept only when the whole site is scored.
        site_table: list[dict[str, Any]] = []
        result: dict[str, Any] | None = None
        site_infos: dict[str, Any] = {}
        try:
            if model is not None:
                test = test_of(cfg)
                result = evaluate_sliceset(model, test, cfg.data.label_names, device, cfg.eval.batch_size,
                                           largest_component or cfg.eval.largest_component)
                site_table += site_rows("global", site, "unseen", {"test": result["summary"]}, cfg.data.label_names)
                if overlays_dir is not None:
                    logits = predict_logits(model, test.images, device, cfg.eval.batch_size)
                    write_overlays(test, logits > 0, overlays_dir / site)
            for name, scorer in scorers.items():
                metrics, site_infos[name] = scorer.score(test_of(scorer.config), device, largest_component)
                site_table += site_rows(name, site, "unseen", metrics, scorer.config.data.label_names)
        except (ValueError, OSError) as e:  # this site's data: score the others, report it at the end
            failed[site] = str(e)
            continue
        rows += site_table
        if result is not None:
            results[site] = result
        for name, info in site_infos.items():
            if info is not None:
                infos[name][site] = info
    if rows:
        print(format_table(rows))
    for name, by_site in infos.items():
        for site, info in by_site.items():
            print(scorers[name].describe(site, info))
    if json_path is not None:
        write_json(json_path, {"model": str(model_path) if model_path else None,
                               "saved_models": {name: str(scorer.path) for name, scorer in scorers.items()},
                               "table": rows, "sites": results, "info": infos, "failed_sites": failed},
                   indent=2)
    return report_failures({f"site {site}": reason for site, reason in failed.items()}, len(sites), "site")


def report_failures(failed: Mapping[str, str], total: int, what: str) -> int:
    """Print the items of a batch command that failed (``failed``: item -> reason; a reason that starts by naming
    its item is not made to name it twice) on stderr, after the work on the others is done. Returns the exit code
    of such a command: 0 when none failed, 1 otherwise."""
    if not failed:
        return 0
    others = "; the others are done" if len(failed) < total else ""
    print(f"{len(failed)} of {total} {what}(s) failed{others}:", file=sys.stderr)
    for item, reason in failed.items():
        print(f"  {item}: {reason.removeprefix(f'{item}: ')}", file=sys.stderr)
    return 1


def write_overlays(s: SliceSet, pred: np.ndarray, out_dir: Path) -> list[Path]:
    """One RGB PNG per image: the (first channel of the) image in grey, ground-truth contours in green,
    predicted contours in red, where they coincide yellow. ``pred``: (N, L, H, W) bool."""
    from PIL import Image
    from skimage.segmentation import find_boundaries

    claim(out_dir, "feddg evaluate --overlays")  # made here, marked as ours (feddg.folders)
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
    """Segment one NIfTI scan and write the mask with the scan's own affine, orientation and size.

    The scan is read by the training loader's own rule (:func:`feddg.data.layouts.read_nifti`): trailing axes of
    length 1 are dropped, the rest must be a finite 3D volume; otherwise a DataError (a ValueError) names the file
    and says what is wrong.
    """
    import nibabel as nib

    scan = read_nifti(in_path, what="scan")
    labels = scan.to_stored(segment_volume(predict, scan.data, scan.zooms, cfg)).astype(np.uint8)
    header = scan.stored.header.copy()
    header.set_data_dtype(np.uint8)
    header.set_slope_inter(1, 0)
    out = nib.Nifti1Image(labels, scan.stored.affine, header)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(out, str(out_path))
    return out_path


def _mask_path(scan: Path, out_dir: Path) -> Path:
    stem = scan.name[: -len(".nii.gz")] if scan.name.endswith(".nii.gz") else scan.stem
    return out_dir / f"{stem}_mask.nii.gz"


def plan_segmentation(inputs: list[Path], out_dir: Path, overwrite: bool = False) -> dict[Path, Path]:
    """The scans named by ``inputs`` (NIfTI files, or folders of them), each with the mask file it is segmented
    into (``<out_dir>/<scan>_mask.nii.gz``), checked as a whole before anything is written.

    Label files (SAML masks, ``<case>_segmentation`` / ``_Segmentation``: :func:`feddg.data.layouts.saml_mask_case`)
    are not scans: they are skipped with a printed note, so a site folder of the training layout can be given as
    it is. A file named twice is segmented once. Raises ValueError, naming the files, for inputs that are missing or
    not NIfTI, when no scan is left, for two scans whose masks would have the same name, for a mask that would
    replace one of the inputs, and for masks that exist already unless ``overwrite``."""
    scans: list[Path] = []
    problems: list[str] = []
    for given in inputs:
        if given.is_dir():
            found = sorted(q for q in given.iterdir()
                           if q.name.endswith(NIFTI_SUFFIXES) and not q.name.startswith(".") and q.is_file())
        elif given.is_file() and given.name.endswith(NIFTI_SUFFIXES):
            found = [given]
        else:
            problems.append(f"{given}: " + ("not a NIfTI file (.nii or .nii.gz) or a folder of them"
                                            if given.exists() else "no such file or folder"))
            continue
        labels = [q for q in found if saml_mask_case(q.name) is not None]
        if labels:
            folder = given if given.is_dir() else given.parent
            print(f"skipped {len(labels)} label file(s) (<case>_segmentation) in {folder}: {_names(labels)}")
        scans += [q for q in found if saml_mask_case(q.name) is None]
    if problems:
        raise ValueError("; ".join(problems))
    plan: dict[Path, Path] = {}
    seen: set[Path] = set()
    for scan in scans:
        if scan.resolve() not in seen:
            seen.add(scan.resolve())
            plan[scan] = _mask_path(scan, out_dir)
    if not plan:
        raise ValueError(f"no NIfTI scans to segment in {', '.join(str(p) for p in inputs)}")
    by_mask: dict[Path, list[Path]] = {}
    for scan, mask in plan.items():
        by_mask.setdefault(mask.resolve(), []).append(scan)
    clashes = [(mask, found) for mask, found in by_mask.items() if len(found) > 1]
    if clashes:
        mask, found = clashes[0]
        more = f" ({len(clashes) - 1} more such clash(es))" if len(clashes) > 1 else ""
        raise ValueError(f"{' and '.join(str(q) for q in found)} would both be segmented into {mask}{more}; "
                         f"segment them into different --out folders")
    replaced = [scan for scan in plan if scan.resolve() in by_mask]
    if replaced:
        raise ValueError(f"{replaced[0]} is both a scan to segment and the mask of "
                         f"{by_mask[replaced[0].resolve()][0]}; choose another --out folder")
    existing = [mask for mask in plan.values() if mask.exists()]
    if existing and not overwrite:
        raise ValueError(f"{len(existing)} mask file(s) exist already in {out_dir} ({_names(existing)}); pass "
                         f"--overwrite to replace them, or choose another --out folder")
    return plan


def _names(paths: list[Path], limit: int = 3) -> str:
    return ", ".join(p.name for p in paths[:limit]) + (", ..." if len(paths) > limit else "")


def segment_scans(model_path: Path, inputs: list[Path], out_dir: Path, largest_component: bool = False,
                  overwrite: bool = False) -> int:
    """``feddg segment``: each scan's mask as ``<out_dir>/<scan>_mask.nii.gz``.

    The inputs and outputs are checked as a whole first (:func:`plan_segmentation`), then the scans are segmented
    one by one: a scan that cannot be segmented does not stop the others, and the failures are listed at the end.
    Returns the process exit code: 0, or 1 when a scan failed."""
    plan = plan_segmentation(inputs, out_dir, overwrite)
    device = select_device()
    model, cfg = load_checkpoint(model_path, device)
    if cfg.data.task != "prostate":
        raise ValueError(f"{model_path}: NIfTI segmentation is for MRI models; this one is a {cfg.data.task} model")
    if largest_component:
        cfg.eval.largest_component = True

    def predict(images: np.ndarray) -> np.ndarray:
        return predict_logits(model, images, device, cfg.eval.batch_size)

    failed: dict[str, str] = {}
    for scan, mask in plan.items():
        try:
            segment_nifti(predict, scan, mask, cfg)
        except (ValueError, OSError) as e:  # this scan: segment the others, report it at the end
            failed[str(scan)] = str(e)
            continue
        print(f"{scan} -> {mask}")
    return report_failures(failed, len(plan), "scan")

