"""The MLA bundle: everything a hospital outside the federation needs to apply MLA (MLA-BIN, section 2.2,
"Application") to its own images, in one folder.

    <bundle>/
      manifest.json            format, site order, network configuration, encoder, attention, default mode
      local_models/site_00.pt  the K local models' state dicts l_i, one file per site, in site order
      encoder.pt               the shared encoder's state dict (Eq. 2)
      attention.pt             the domain attention module's state dict (Eq. 3)

Applying it (:meth:`MLABundle.combine`): encode the hospital's preprocessed images with the shared encoder, run the
attention module, average its per-image softmax (Eq. 3), and weight the local models with it (Eq. 4).

Files are written with ``torch.save`` and read with ``torch.load(weights_only=True)`` (plain tensors, no pickled
code); ``manifest.json`` is written last and atomically (``feddg.jsonfile.write_json``), so a folder with a manifest
is complete. Site files are numbered rather than named after the sites, which may contain any character; the
manifest maps each site to its file.

The random encoder is rebuilt from its manifest entry (kind, in_channels, seed, width, depth) and its stored weights
are then loaded: the stored weights are authoritative. If the seed regenerates different weights (another torch
version), a warning says so, because the sites' feature bank was computed with the regenerated weights.

Why one module: the bundle's writer, reader, checks and scorer are one file format; splitting them would put its
contract (which file holds what, what is checked on reading) in two places.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import feddg
from feddg.config import FedDGConfig
from feddg.data.dataset import SliceSet
from feddg.evaluation import evaluate_sliceset, predict_logits, score_logits
from feddg.experiment import experiment_from_dict
from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections
from feddg.jsonfile import write_json
from feddg.methods.mla.attention import MODES, DomainAttention, attention_weights
from feddg.methods.mla.combination import check_state_dicts, combine_state_dicts
from feddg.methods.mla.encoders import GlobalModelEncoder, RandomEncoder, encode
from feddg.nets.unet import build_model

FORMAT = "feddg-mla-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ENCODER_FILE = "encoder.pt"
ATTENTION_FILE = "attention.pt"
REQUIRED_FIELDS = ("format", "format_version", "sites", "local_models", "config", "encoder", "attention",
                   "attention_mode")


def _state_dict(model: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    sd = model.state_dict() if isinstance(model, nn.Module) else model
    return {k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))
            for k, v in sd.items()}


def _config_dict(config: FedDGConfig | Mapping[str, Any]) -> dict[str, Any]:
    raw = config.to_dict() if isinstance(config, FedDGConfig) else dict(config)
    experiment_from_dict(json.loads(json.dumps(raw)))  # validates, and proves it survives JSON
    return json.loads(json.dumps(raw))


def save_bundle(
    path: str | os.PathLike,
    local_models: Mapping[str, nn.Module | Mapping[str, torch.Tensor]],
    encoder: RandomEncoder | GlobalModelEncoder,
    attention: DomainAttention,
    config: FedDGConfig | Mapping[str, Any],
    site_order: Sequence[str] | None = None,
    attention_mode: str = "mean",
    overwrite: bool = False,
) -> Path:
    """Write a bundle folder (created if needed) and return its path.

    Args:
        local_models: site -> its local model (module, or state dict of tensors or numpy arrays).
        encoder: the shared encoder the feature bank was computed with.
        attention: the trained DAM; its output i is ``site_order[i]``.
        config: the experiment configuration (a FedDGConfig or its ``to_dict()``); the network is built from it.
        site_order: the DAM's site order (as :func:`~feddg.methods.mla.attention.train_domain_attention` returns it);
            default: the order of ``local_models``. Must name exactly the sites of ``local_models``.
        attention_mode: the default mode written into the manifest, "mean" or "per_image".
        overwrite: replace an existing bundle in ``path`` (otherwise a folder with a manifest is refused).

    Raises:
        ValueError: sites and models do not match, the models disagree or do not fit the configured network, the
            DAM's output size is not the number of sites, the encoder's width is not the DAM's input width, the mode
            is unknown, or ``path`` already holds a bundle.
    """
    path = Path(path)
    sites = list(site_order) if site_order is not None else list(local_models)
    if sorted(sites) != sorted(local_models) or len(set(sites)) != len(sites):
        raise ValueError(f"site order {sites} does not name exactly the local models' sites {list(local_models)}")
    if attention_mode not in MODES:
        raise ValueError(f"attention_mode must be one of {list(MODES)}, got {attention_mode!r}")
    if attention.num_sites != len(sites):
        raise ValueError(f"the attention module outputs {attention.num_sites} domains but there are {len(sites)} "
                         f"local models")
    if encoder.out_features != attention.in_features:
        raise ValueError(f"the encoder gives {encoder.out_features} features but the attention module takes "
                         f"{attention.in_features}")
    cfg_dict = _config_dict(config)
    states = [_state_dict(local_models[s]) for s in sites]
    _check_models(states, sites, experiment_from_dict(cfg_dict))
    if (path / MANIFEST).exists() and not overwrite:
        raise ValueError(f"{path}: already holds an MLA bundle (pass overwrite=True to replace it)")

    (path / "local_models").mkdir(parents=True, exist_ok=True)
    files = {}
    for i, (site, sd) in enumerate(zip(sites, states)):
        rel = f"local_models/site_{i:02d}.pt"
        torch.save(sd, path / rel)
        files[site] = rel
    torch.save(_state_dict(encoder), path / ENCODER_FILE)
    torch.save(_state_dict(attention), path / ATTENTION_FILE)
    if isinstance(encoder, RandomEncoder):
        enc_entry: dict[str, Any] = {"kind": RandomEncoder.kind, **encoder.hparams()}
    elif isinstance(encoder, GlobalModelEncoder):
        enc_entry = {"kind": GlobalModelEncoder.kind}
    else:
        raise TypeError(f"unknown encoder type {type(encoder).__name__}: expected RandomEncoder or "
                        f"GlobalModelEncoder")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "feddg_version": getattr(feddg, "__version__", None),
        "sites": sites,
        "local_models": files,
        "config": cfg_dict,
        "encoder": {**enc_entry, "file": ENCODER_FILE},
        "attention": {**attention.hparams(), "file": ATTENTION_FILE},
        "attention_mode": attention_mode,
    }
    write_json(path / MANIFEST, manifest, indent=2)
    return path


def _build(cfg: FedDGConfig) -> nn.Module:
    """The configured network, built without advancing the caller's global torch RNG (its initial weights are
    overwritten anyway)."""
    with torch.random.fork_rng(devices=[]):
        return build_model(cfg)


def _check_models(states: list[dict[str, torch.Tensor]], sites: list[str], cfg: FedDGConfig) -> None:
    """The local models agree with each other and with the network the configuration describes."""
    check_state_dicts(states, labels=sites)
    reference = dict(_build(cfg).state_dict())
    try:
        check_state_dicts([reference, states[0]], labels=["configured network", sites[0]])
    except ValueError as e:
        raise ValueError(f"the local models do not fit the configured network: {e}") from None


@dataclass
class MLABundle:
    """A loaded bundle (see :func:`load_bundle`).

    Attributes:
        path: the bundle folder (None for a bundle received as a task payload, :func:`bundle_from_payload`).
        manifest: the parsed ``manifest.json``.
        sites: the K sites, in the attention module's output order.
        config: the experiment configuration (network, preprocessing).
        local_states: site -> its local model's state dict.
        encoder: the shared encoder, frozen, in evaluation mode.
        attention: the domain attention module, in evaluation mode.
        attention_mode: the manifest's default mode.
    """

    path: Path | None
    manifest: dict[str, Any]
    sites: list[str]
    config: FedDGConfig
    local_states: dict[str, dict[str, torch.Tensor]]
    encoder: nn.Module
    attention: DomainAttention
    attention_mode: str

    def features(self, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """Eq. (2) for preprocessed images (N, C, H, W), exactly as the network receives them (same normalization
        and ``config.data.image_size`` as in training): (N, F) float32."""
        return encode(self.encoder, images, batch_size=batch_size)

    def weights(self, images: np.ndarray, mode: str | None = None) -> np.ndarray:
        """The attention weights D^w: (K,) for ``"mean"``, (N, K) for ``"per_image"``; None: the manifest's mode."""
        mode = mode or self.attention_mode
        return attention_weights(self.attention, self.features(images), mode=mode).numpy()

    def model_for(self, weights: Sequence[float] | np.ndarray) -> nn.Module:
        """The network with the local models combined by ``weights`` (K,), Eq. (4), in evaluation mode on the CPU."""
        combined = combine_state_dicts([self.local_states[s] for s in self.sites], weights, labels=self.sites)
        model = _build(self.config)
        model.load_state_dict(combined)
        return model.eval()

    def combine(self, images: np.ndarray, mode: str | None = "mean") -> tuple[nn.Module, np.ndarray]:
        """MLA's application phase for one unseen domain: (combined model, weights (K,)).

        ``mode`` must resolve to ``"mean"`` (one model for all the images; None takes the manifest's default). For
        one model per image, use ``weights(images, "per_image")`` and :meth:`model_for` on each row.
        """
        mode = mode or self.attention_mode
        if mode != "mean":
            raise ValueError(f"combine builds one model for a set of images and needs mode 'mean', got {mode!r}; "
                             f"use weights(images, 'per_image') and model_for(row) for one model per image")
        w = self.weights(images, "mean")
        return self.model_for(w), w


def _fail(path: Path | str, problem: str) -> ValueError:
    return ValueError(f"MLA bundle {path}: {problem}")


def _load_tensors(path: Path, rel: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(rel, str) or not rel:
        raise _fail(path, f"manifest.json: the file of {what} is not a file name: {rel!r}")
    f = path / rel
    if not f.is_file():
        raise _fail(path, f"file {rel!r} ({what}) listed in manifest.json is missing")
    try:
        sd = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise _fail(path, f"cannot read {rel!r} ({what}): {e}") from e
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise _fail(path, f"{rel!r} ({what}) is not a state dict of tensors")
    return sd


def _field(path: Path | str, entry: Any, name: str, where: str = "manifest.json") -> Any:
    if not isinstance(entry, Mapping):
        raise _fail(path, f"{where}: expected an object, got {entry!r}")
    if name not in entry:
        raise _fail(path, f"{where}: missing field {name!r}")
    return entry[name]


def load_bundle(path: str | os.PathLike) -> MLABundle:
    """Read and check a bundle written by :func:`save_bundle`.

    Raises:
        ValueError, naming the bundle path and the problem: no or unreadable manifest, another format or a newer
        format version, a missing manifest field, a listed file that is missing or unreadable, local models that
        disagree in keys or shapes (naming the key and both sites) or do not fit the configured network, an
        attention module whose output size is not the number of sites, or an encoder whose width is not the
        attention module's input width.
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise _fail(path, f"{MANIFEST} is missing (not an MLA bundle)")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise _fail(path, f"cannot read {MANIFEST}: {e}") from e

    def local(site: str, entry: Any) -> dict[str, torch.Tensor]:
        return _load_tensors(path, entry, f"local model of site {site!r}")

    def part(name: str, entry: Any) -> dict[str, torch.Tensor]:
        what = {"encoder": "encoder", "attention": "attention module"}[name]
        return _load_tensors(path, _field(path, entry, "file", f"manifest.json: {name}"), what)

    return _assemble(path, path, manifest, local, part)


def _assemble(
    where: Path | str,
    path: Path | None,
    manifest: Any,
    local: Callable[[str, Any], dict[str, torch.Tensor]],
    part: Callable[[str, Any], dict[str, torch.Tensor]],
) -> MLABundle:
    """The checks of :func:`load_bundle` on a parsed manifest; ``local(site, manifest entry)`` and
    ``part("encoder" | "attention", manifest entry)`` fetch the state dicts (from files or from a payload)."""
    if not isinstance(manifest, dict):
        raise _fail(where, f"{MANIFEST} does not hold a JSON object")
    for name in REQUIRED_FIELDS:
        _field(where, manifest, name)
    if manifest["format"] != FORMAT:
        raise _fail(where, f"manifest.json: format is {manifest['format']!r}, expected {FORMAT!r}")
    version = manifest["format_version"]
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise _fail(where, f"manifest.json: format_version {version!r} is not supported (this feddg reads up to "
                           f"{FORMAT_VERSION})")
    sites = manifest["sites"]
    if not isinstance(sites, list) or not sites or len(set(sites)) != len(sites):
        raise _fail(where, f"manifest.json: 'sites' must be a non-empty list of distinct names, got {sites!r}")
    mode = manifest["attention_mode"]
    if mode not in MODES:
        raise _fail(where, f"manifest.json: attention_mode must be one of {list(MODES)}, got {mode!r}")
    try:
        cfg = experiment_from_dict(manifest["config"])
    except (ValueError, TypeError) as e:
        raise _fail(where, f"manifest.json: invalid 'config': {e}") from e

    files = manifest["local_models"]
    if not isinstance(files, dict):
        raise _fail(where, "manifest.json: 'local_models' must map each site to its file")
    states = {}
    for site in sites:
        if site not in files:
            raise _fail(where, f"manifest.json: 'local_models' lists no file for site {site!r}")
        states[site] = local(site, files[site])
    try:
        _check_models([states[s] for s in sites], sites, cfg)
    except ValueError as e:
        raise _fail(where, f"local models: {e}") from None

    enc_entry = manifest["encoder"]
    kind = _field(where, enc_entry, "kind", "manifest.json: encoder")
    enc_sd = part("encoder", enc_entry)
    if kind == RandomEncoder.kind:
        hp = {k: _field(where, enc_entry, k, "manifest.json: encoder") for k in ("in_channels", "seed", "width",
                                                                                   "depth")}
        try:
            encoder: nn.Module = RandomEncoder(**hp)
        except (TypeError, ValueError) as e:
            raise _fail(where, f"manifest.json: invalid random encoder entry {hp}: {e}") from None
        regenerated = encoder.state_dict()
        if regenerated.keys() == enc_sd.keys() and not all(
            regenerated[k].shape == enc_sd[k].shape and torch.equal(regenerated[k], enc_sd[k]) for k in enc_sd
        ):
            warnings.warn(f"MLA bundle {where}: the random encoder's seed {hp['seed']} regenerates different "
                          f"weights on this machine (another torch version?); using the bundle's stored weights",
                          stacklevel=3)
    elif kind == GlobalModelEncoder.kind:
        encoder = GlobalModelEncoder(_build(cfg))
    else:
        raise _fail(where, f"manifest.json: unknown encoder kind {kind!r}")
    try:
        encoder.load_state_dict(enc_sd)
    except RuntimeError as e:
        raise _fail(where, f"encoder.pt does not fit the {kind} encoder: {e}") from None
    encoder.eval()

    att_entry = manifest["attention"]
    hp = {k: _field(where, att_entry, k, "manifest.json: attention") for k in ("in_features", "num_sites",
                                                                                "conv_channels", "hidden")}
    att_sd = part("attention", att_entry)
    out = att_sd.get("fc2.weight")
    if out is None:
        raise _fail(where, "the attention module's state dict has no 'fc2.weight' (not a DomainAttention)")
    if out.shape[0] != len(sites) or hp["num_sites"] != len(sites):
        raise _fail(where, f"the attention module outputs {out.shape[0]} domains (manifest: {hp['num_sites']}) but "
                           f"the bundle has {len(sites)} sites {sites}")
    try:
        attention = DomainAttention(**hp)
        attention.load_state_dict(att_sd)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _fail(where, f"attention.pt does not fit the manifest's attention sizes {hp}: {e}") from None
    attention.eval()
    if getattr(encoder, "out_features", None) != attention.in_features:
        raise _fail(where, f"the encoder gives {getattr(encoder, 'out_features', None)} features but the attention "
                           f"module takes {attention.in_features}")
    return MLABundle(path, manifest, list(sites), cfg, states, encoder, attention, mode)


# ---------------------------------------------------------------------------------------------- payload form

PAYLOAD_KEYS = ("manifest", "local_models", "encoder", "attention")


def _arrays(sd: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in sd.items()}


def bundle_to_payload(bundle: MLABundle) -> dict[str, Any]:
    """The bundle as plain data for an NVFlare task (numpy arrays, strings, numbers; no files, no code)::

        {"manifest": the manifest (JSON-able), "local_models": {site: {key: array}},
         "encoder": {key: array}, "attention": {key: array}}

    :func:`bundle_from_payload` reverses it with the same checks as :func:`load_bundle`.
    """
    return {
        "manifest": json.loads(json.dumps(bundle.manifest)),
        "local_models": {site: _arrays(bundle.local_states[site]) for site in bundle.sites},
        "encoder": _arrays(bundle.encoder.state_dict()),
        "attention": _arrays(bundle.attention.state_dict()),
    }


def _payload_tensors(where: str, sd: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(sd, Mapping) or not sd or not all(
        isinstance(k, str) and isinstance(v, (np.ndarray, np.generic)) for k, v in sd.items()
    ):
        raise _fail(where, f"{what} is not a state dict of arrays")
    try:
        return {k: torch.from_numpy(np.array(v)) for k, v in sd.items()}
    except TypeError as e:
        raise _fail(where, f"{what}: {e}") from None


def bundle_from_payload(payload: Any, where: str = "payload") -> MLABundle:
    """The bundle of :func:`bundle_to_payload`, checked as :func:`load_bundle` checks a folder.

    Raises:
        ValueError, starting with "MLA bundle payload:" and naming the problem (the same refusals as
        :func:`load_bundle`, plus a payload that lacks one of its four parts or holds something else than arrays).
    """
    if not isinstance(payload, Mapping):
        raise _fail(where, f"expected a mapping with {list(PAYLOAD_KEYS)}, got {type(payload).__name__}")
    missing = [k for k in PAYLOAD_KEYS if k not in payload]
    extra = sorted(str(k) for k in payload if k not in PAYLOAD_KEYS)
    if missing or extra:
        raise _fail(where, f"expected exactly the parts {list(PAYLOAD_KEYS)} (missing {missing}, unexpected {extra})")
    models = payload["local_models"]
    if not isinstance(models, Mapping):
        raise _fail(where, "'local_models' must map each site to its state dict")

    def local(site: str, _entry: Any) -> dict[str, torch.Tensor]:
        if site not in models:
            raise _fail(where, f"no local model for site {site!r}")
        return _payload_tensors(where, models[site], f"local model of site {site!r}")

    def part(name: str, _entry: Any) -> dict[str, torch.Tensor]:
        what = {"encoder": "encoder", "attention": "attention module"}[name]
        return _payload_tensors(where, payload[name], what)

    manifest = payload["manifest"]
    if isinstance(manifest, Mapping) and isinstance(manifest.get("sites"), list):
        unexpected = sorted(str(s) for s in models if s not in manifest["sites"])
        if unexpected:
            raise _fail(where, f"local models of sites the manifest does not list: {unexpected}")
    return _assemble(where, None, manifest, local, part)


# ---------------------------------------------------------------------------------------------- application


def evaluate_with_bundle(
    bundle: MLABundle,
    splits: Mapping[str, SliceSet],
    weight_split: str,
    device: torch.device,
    batch_size: int = 16,
    largest_component: bool = False,
    mode: str | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """MLA's application phase at one site, scored with the project's metric code (as the ``evaluate`` task does).

    Args:
        bundle: the MLA bundle.
        splits: split name -> the site's images of that split (non-empty), e.g. {"val": ..., "test": ...}.
        weight_split: the split whose images give the attention weights D^w (an unseen site: "test"; a training
            site: "val"). In ``"mean"`` mode one combined model, from the mean per-image softmax over these images,
            is scored on every split. In ``"per_image"`` mode each image gets the model of its own D^w, and the
            reported weights are the mean over ``weight_split``'s images.
        mode: "mean" or "per_image"; None: the bundle's default.

    Returns:
        ({split: summary}, info): the summaries are :func:`~feddg.evaluation.evaluate_sliceset`'s; info holds
        ``weights`` {site: D^w_i}, ``weights_from`` (the split), ``n_images`` (images that gave the weights),
        ``mode`` and ``cases`` ({split: the per-case results}).
    """
    mode = mode or bundle.attention_mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if weight_split not in splits or len(splits[weight_split]) == 0:
        raise ValueError(f"no {weight_split!r} images to compute the attention weights from")
    label_names = bundle.config.data.label_names
    weight_images = splits[weight_split].images
    results: dict[str, dict[str, Any]] = {}
    if mode == "mean":
        w = bundle.weights(weight_images, "mean")
        model = bundle.model_for(w).to(device)
        for name, s in splits.items():
            results[name] = evaluate_sliceset(model, s, label_names, device, batch_size, largest_component)
    else:
        w = bundle.weights(weight_images, "per_image").mean(axis=0)
        states = [bundle.local_states[site] for site in bundle.sites]
        model = _build(bundle.config).to(device).eval()
        for name, s in splits.items():
            per_image = bundle.weights(s.images, "per_image")
            logits = []
            for i in range(len(s)):
                model.load_state_dict(combine_state_dicts(states, per_image[i], labels=bundle.sites))
                logits.append(predict_logits(model, s.images[i : i + 1], device, batch_size))
            results[name] = score_logits(np.concatenate(logits), s, label_names, largest_component)
    info = {"weights": {site: float(v) for site, v in zip(bundle.sites, w)}, "weights_from": weight_split,
            "n_images": int(len(weight_images)), "mode": mode,
            "cases": {name: r["cases"] for name, r in results.items()}}
    return {name: r["summary"] for name, r in results.items()}, info


class BundleScorer:
    """MLA's saved model as ``feddg evaluate`` scores it (:class:`feddg.flare.method_spec.SavedModel`): the bundle at
    ``path``, applied to a hospital's own images (:func:`evaluate_with_bundle`, weights from its test images)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.bundle = load_bundle(path)
        self.config = self.bundle.config

    def score(self, test: SliceSet, device: torch.device,
              largest_component: bool) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        return evaluate_with_bundle(self.bundle, {"test": test}, "test", device, self.config.eval.batch_size,
                                    largest_component or self.config.eval.largest_component)

    @staticmethod
    def describe(site: str, info: Mapping[str, Any]) -> str:
        return (f"MLA attention weights at {site} ({info['mode']}, from {info['n_images']} images): "
                + ", ".join(f"{s} {w:.3f}" for s, w in info["weights"].items()))
