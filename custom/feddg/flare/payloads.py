"""What may travel between a site and the server, as DXOs, and the checks that enforce it.

Builders (``*_dxo``) and checks (``check_*``) live together so that the executor that builds a payload, the job's
filters, the site's egress filter (:mod:`feddg.flare.egress_filter`) and the server agree on one definition. The
checks raise :class:`PayloadRejected` with a reason that names what is wrong but never carries the values.

Every task (results of the ``train``, ``evaluate`` and ``site_info`` tasks):
  * ``train`` result: DXO ``WEIGHTS`` or ``WEIGHT_DIFF`` with exactly the keys and shapes of the job's network,
      finite numbers (:func:`feddg.flare.updates.check_update`, the one "weights fit the network" check), at most
      a site's parameter budget; meta: scalars under :data:`TRAIN_META`.
  * ``evaluate`` result: DXO ``METRICS``, nested summaries of scalars; meta :data:`EVALUATE_META`.
  * ``site_info`` result: DXO ``METRICS`` with two short strings (feddg version, preprocessing hash).

Amplitude exchange (ELCFS):
  * result of the ``amplitude_spectra`` task, DXO kind ``AMPLITUDE_WINDOW``:
      data {"amplitude_window": float32 (N, C, 2 b_h + 1, 2 b_w + 1), non-negative, finite}
      meta {"payload": "amplitude_window", "half_widths": [b_h, b_w], "num_images": N, "image_size": [H, W]}
  * data of the ``amplitude_bank`` task, DXO kind ``AMPLITUDE_BANK``:
      data {site: float32 (N_site, C, 2 b_h + 1, 2 b_w + 1)}
      meta {"payload": "amplitude_bank", "half_widths": [b_h, b_w]}

Feature bank (MLA):
  * data of the ``mla_features`` task, DXO kind ``MLA_ENCODER``: the shared encoder of Eq. (2), as a recipe
      random encoder: data {}, meta {"payload": "mla_encoder", "encoder": "random", "in_channels": C, "seed": s,
                                      "width": w, "depth": d, "max_images": n or None}
      global model's encoder: data {the final global model's weights}, meta {"payload": "mla_encoder",
                                      "encoder": "global", "max_images": n or None}
  * result of the ``mla_features`` task, DXO kind ``FEATURE_MATRIX``:
      data {"features": float32 (N, F), finite}
      meta {"payload": "feature_matrix", "num_images": N, "width": F}
  * data of the ``mla_evaluate`` task, DXO kind ``MLA_BUNDLE``: the MLA bundle in its payload form
      (:func:`feddg.mla_bundle.bundle_to_payload`: manifest, local models, encoder, attention module), checked at
      the site with :func:`feddg.mla_bundle.bundle_from_payload`. Result: DXO ``METRICS`` as for ``evaluate``,
      meta {"model_name": "mla", "attention_weights": {site: D^w_i}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, MetaKey

from nvflare.apis.shareable import ReservedHeaderKey, Shareable

from feddg.config import ConfigError, FedDGConfig
from feddg.flare.constants import FedDGMeta
from feddg.flare.updates import UpdateRejected, check_update
from feddg.methods.frequency import window_half_widths
from feddg.methods.mla.features import check_feature_matrix

AMPLITUDE_WINDOW = "AMPLITUDE_WINDOW"
AMPLITUDE_BANK = "AMPLITUDE_BANK"
MLA_ENCODER = "MLA_ENCODER"
MLA_BUNDLE = "MLA_BUNDLE"
FEATURE_MATRIX = "FEATURE_MATRIX"
_FEATURES_KEY = "features"
_WINDOW_KEY = "amplitude_window"
_DXO_KEY = "DXO"  # where DXO.to_shareable stores the payload
_HEADERS_KEY = ReservedHeaderKey.HEADERS
# Meta keys NVFlare itself may add to a DXO on its way out.
_NVFLARE_META = {MetaKey.FILTER_HISTORY}


# A site's limits when its policy names none (`feddg install-policy` writes them into privacy.json).
DEFAULT_MAX_PARAMETERS = 50_000_000  # values in a model update (the papers' U-Net at 384 px has about 2 million)
DEFAULT_MAX_HALF_WIDTH = 8  # amplitude window: at most 17 x 17 values per channel (alpha 0.01 of an 800 px image)
DEFAULT_MAX_FEATURE_WIDTH = 512  # MLA feature values per image (the jobs send 128; a 32 x 32 image needs 1024)

# Scalars the results of the shared tasks may carry in their metadata.
TRAIN_META = {FedDGMeta.NUM_TRAIN_SAMPLES, FedDGMeta.VAL_DICE, FedDGMeta.VAL_LOSS, FedDGMeta.TRAIN_LOSS,
              FedDGMeta.GENERALIZATION_GAP, MetaKey.NUM_STEPS_CURRENT_ROUND, FedDGMeta.SHARE_LOCAL_MODEL}
EVALUATE_META = {FedDGMeta.MODEL_NAME, FedDGMeta.ROUND}
MLA_EVALUATE_META = EVALUATE_META | {"attention_weights", "attention_sites"}


class PayloadRejected(ValueError):
    """A payload is not what the task may carry; the message says why (never the values)."""


# ------------------------------------------------------------------------------------- train, evaluate, site_info


def _is_scalar(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, np.integer, np.floating)):
        return True
    return isinstance(value, str) and len(value) <= 256


def check_scalar_meta(dxo: DXO, allowed: set[str], max_list: int = 0) -> None:
    """Meta keys are among ``allowed`` and hold scalars (or, with ``max_list``, short lists / maps of scalars)."""
    for key, value in (dxo.meta or {}).items():
        if key in _NVFLARE_META:
            continue
        if key not in allowed:
            raise PayloadRejected(f"meta key {key!r} is not one this task may send")
        if _is_scalar(value):
            continue
        items = list(value.values()) if isinstance(value, Mapping) else value
        if (max_list and isinstance(items, (list, tuple)) and len(items) <= max_list
                and all(_is_scalar(v) for v in items)
                and (not isinstance(value, Mapping) or all(isinstance(k, str) and len(k) <= 256 for k in value))):
            continue
        raise PayloadRejected(f"meta {key!r} is not a scalar")


def check_weights_payload(dxo: DXO, reference: Mapping[str, np.ndarray], max_parameters: int) -> None:
    """Model weights or weight differences that fit the reference network: numpy arrays of integers or floats
    with exactly its keys and shapes, finite (:func:`feddg.flare.updates.check_update`), at most
    ``max_parameters`` values."""
    if dxo.data_kind not in (DataKind.WEIGHTS, DataKind.WEIGHT_DIFF):
        raise PayloadRejected(f"expected model weights or weight differences, got {dxo.data_kind}")
    if not isinstance(dxo.data, dict):
        raise PayloadRejected("the weights are not a mapping")
    for name, value in dxo.data.items():
        if not isinstance(value, np.ndarray):
            raise PayloadRejected(f"parameter {name!r} is not an array")
        if value.dtype.kind not in "fiu":
            raise PayloadRejected(f"parameter {name!r} has dtype {value.dtype}")
    try:
        check_update(dxo.data, reference, against="the job's network")
    except UpdateRejected as e:
        raise PayloadRejected(str(e)) from None
    total = sum(value.size for value in dxo.data.values())
    if total > max_parameters:
        raise PayloadRejected(f"{total} values exceed the site's limit of {max_parameters} parameters")


def check_metrics_payload(dxo: DXO, max_values: int = 10_000, max_depth: int = 6) -> None:
    """METRICS: nested mappings whose leaves are scalars; no arrays, a bounded number of values."""
    if dxo.data_kind != DataKind.METRICS:
        raise PayloadRejected(f"expected metrics, got {dxo.data_kind}")
    count = 0

    def walk(node: Any, depth: int) -> None:
        nonlocal count
        if depth > max_depth:
            raise PayloadRejected("metrics nest too deeply")
        if isinstance(node, Mapping):
            for key, value in node.items():
                if not isinstance(key, str) or len(key) > 256:
                    raise PayloadRejected("metric names must be short strings")
                walk(value, depth + 1)
            return
        if not _is_scalar(node):
            raise PayloadRejected(f"a metric value is a {type(node).__name__}, not a scalar")
        count += 1
        if count > max_values:
            raise PayloadRejected(f"more than {max_values} metric values")

    walk(dxo.data, 0)


def check_train_result(dxo: DXO | None, reference: Mapping[str, np.ndarray], max_parameters: int) -> None:
    """The ``train`` result: the site's weights (or their difference) and scalar metadata."""
    dxo = _required(dxo)
    check_weights_payload(dxo, reference, max_parameters)
    check_scalar_meta(dxo, TRAIN_META)


def check_evaluate_result(dxo: DXO | None) -> None:
    """The ``evaluate`` result: metric summaries of the model it received."""
    dxo = _required(dxo)
    check_metrics_payload(dxo)
    check_scalar_meta(dxo, EVALUATE_META)


def check_site_info_result(dxo: DXO | None) -> None:
    """The ``site_info`` result: the site's feddg version and preprocessing hash."""
    dxo = _required(dxo)
    check_metrics_payload(dxo, max_values=2)
    check_scalar_meta(dxo, set())


def check_mla_evaluate_result(dxo: DXO | None) -> None:
    """The ``mla_evaluate`` result: metric summaries of the attention-combined model and the site's attention
    weights (a short list of scalars in the meta)."""
    dxo = _required(dxo)
    check_metrics_payload(dxo)
    check_scalar_meta(dxo, MLA_EVALUATE_META, max_list=64)


def _required(dxo: DXO | None) -> DXO:
    if dxo is None:
        raise PayloadRejected("no DXO")
    return dxo


# ------------------------------------------------------------------------------------------- amplitude exchange


def amplitude_half_widths(cfg: FedDGConfig) -> tuple[int, int]:
    """(b_h, b_w): the half-widths of the amplitude window the job exchanges, from ``data.image_size`` and
    ``elcfs.alpha`` / ``elcfs.min_half_width`` (:func:`feddg.methods.frequency.window_half_widths`). The one place
    this value is derived: the sites, the server's exchange and every filter call it at run time."""
    size = cfg.data.image_size
    try:
        return window_half_widths(size, size, cfg.elcfs.alpha, cfg.elcfs.min_half_width)
    except ValueError as e:
        raise ConfigError(f"data.image_size / elcfs.alpha: {e}") from e


def amplitude_window_dxo(windows: np.ndarray, half_widths: tuple[int, int], image_size: tuple[int, int]) -> DXO:
    windows = np.ascontiguousarray(windows, dtype=np.float32)
    return DXO(data_kind=AMPLITUDE_WINDOW, data={_WINDOW_KEY: windows},
               meta={"payload": "amplitude_window", "half_widths": [int(half_widths[0]), int(half_widths[1])],
                     "num_images": int(windows.shape[0]), "image_size": [int(image_size[0]), int(image_size[1])]})


def amplitude_bank_dxo(bank: Mapping[str, np.ndarray], half_widths: tuple[int, int]) -> DXO:
    return DXO(data_kind=AMPLITUDE_BANK,
               data={site: np.ascontiguousarray(a, dtype=np.float32) for site, a in bank.items()},
               meta={"payload": "amplitude_bank", "half_widths": [int(half_widths[0]), int(half_widths[1])]})


def check_envelope(shareable: Shareable) -> DXO | None:
    """The Shareable carries nothing outside its DXO and its headers, and no array hides in a header.

    Returns the DXO, or None for a reply without one (an error reply carries nothing)."""
    extra = sorted(str(k) for k in shareable.keys() if k not in (_DXO_KEY, _HEADERS_KEY))
    if extra:
        raise PayloadRejected(f"unexpected top-level keys {extra[:5]} next to the DXO")
    headers = shareable.get(_HEADERS_KEY) or {}
    for key, value in headers.items():
        if key == ReservedHeaderKey.PEER_CTX:  # NVFlare's own context, set by the framework
            continue
        if _holds_bulk_data(value):
            raise PayloadRejected(f"header {key!r} carries array data")
    if _DXO_KEY not in shareable:
        return None
    try:
        raw = shareable[_DXO_KEY]
        return DXO(data_kind=raw["kind"], data=raw["data"], meta=raw.get("meta"))
    except (KeyError, TypeError, ValueError) as e:
        raise PayloadRejected(f"malformed DXO: {e}") from e


def _holds_bulk_data(value: Any, depth: int = 0) -> bool:
    if isinstance(value, (np.ndarray, bytes, bytearray, memoryview)) or type(value).__module__.startswith("torch"):
        return True
    if depth > 3:
        return True
    if isinstance(value, Mapping):
        return any(_holds_bulk_data(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return len(value) > 16 or any(_holds_bulk_data(v, depth + 1) for v in value)
    return False


def _check_meta(dxo: DXO, allowed: Iterable[str]) -> None:
    extra = sorted(set(dxo.meta or {}) - set(allowed) - _NVFLARE_META)
    if extra:
        raise PayloadRejected(f"unexpected meta keys {extra}")
    for key, value in (dxo.meta or {}).items():
        if key in _NVFLARE_META:
            continue
        if _holds_bulk_data(value) or (isinstance(value, (list, tuple)) and len(value) > 2):
            raise PayloadRejected(f"meta {key!r} carries more than a scalar or a pair")


def _declared_half_widths(value: Any) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise PayloadRejected(f"meta 'half_widths' must be two non-negative integers, got {value!r}")
    return int(value[0]), int(value[1])


def check_window_array(
    a: Any,
    half_widths: tuple[int, int],
    where: str,
    max_channels: int = 3,
) -> np.ndarray:
    """One site's windows: float (N, C, 2 b_h + 1, 2 b_w + 1), C <= ``max_channels``, finite, non-negative."""
    if not isinstance(a, np.ndarray):
        raise PayloadRejected(f"{where}: expected a numpy array, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise PayloadRejected(f"{where}: expected floats, got dtype {a.dtype}")
    bh, bw = half_widths
    if a.ndim != 4 or a.shape[2:] != (2 * bh + 1, 2 * bw + 1) or not 1 <= a.shape[1] <= max_channels:
        raise PayloadRejected(f"{where}: shape {a.shape} is not (images, channels <= {max_channels}, "
                              f"{2 * bh + 1}, {2 * bw + 1}), the declared amplitude window")
    if not np.all(np.isfinite(a)):
        raise PayloadRejected(f"{where}: holds NaN or infinite values")
    if np.any(a < 0):
        raise PayloadRejected(f"{where}: holds negative values, which an amplitude never has (phase or image data?)")
    return a


def _check_half_widths(declared: tuple[int, int], half_widths: tuple[int, int] | None, max_half_width: int) -> None:
    if half_widths is not None and tuple(declared) != tuple(half_widths):
        raise PayloadRejected(f"declared window half-widths {list(declared)} differ from the configured "
                              f"{list(half_widths)}")
    if max(declared) > max_half_width:
        raise PayloadRejected(f"window half-widths {list(declared)} exceed the allowed {max_half_width} "
                              f"(a low-frequency window, not a spectrum)")


def check_amplitude_payload(
    dxo: DXO | None,
    half_widths: tuple[int, int] | None = None,
    max_half_width: int = DEFAULT_MAX_HALF_WIDTH,
    max_images: int | None = None,
) -> np.ndarray:
    """The result of the amplitude task is exactly the declared window payload; returns the windows.

    Args:
        dxo: the result's DXO.
        half_widths: the job's (b_h, b_w), or None to accept any declared window up to ``max_half_width``.
        max_half_width: the largest half-width a site lets out.
        max_images: the most images a site lets out (None: no cap).
    """
    if dxo is None or dxo.data_kind != AMPLITUDE_WINDOW:
        raise PayloadRejected(f"expected a DXO of kind {AMPLITUDE_WINDOW}, got {getattr(dxo, 'data_kind', None)}")
    if not isinstance(dxo.data, dict) or set(dxo.data) != {_WINDOW_KEY}:
        keys = sorted(map(str, dxo.data)) if isinstance(dxo.data, dict) else type(dxo.data).__name__
        raise PayloadRejected(f"expected exactly the data key {_WINDOW_KEY!r}, got {keys}")
    _check_meta(dxo, ("payload", "half_widths", "num_images", "image_size"))
    declared = _declared_half_widths(dxo.get_meta_prop("half_widths"))
    _check_half_widths(declared, half_widths, max_half_width)
    windows = check_window_array(dxo.data[_WINDOW_KEY], declared, _WINDOW_KEY)
    n = windows.shape[0]
    if dxo.get_meta_prop("num_images") != n:
        raise PayloadRejected(f"meta num_images {dxo.get_meta_prop('num_images')!r} differs from the {n} windows sent")
    if max_images is not None and n > max_images:
        raise PayloadRejected(f"{n} images exceed the allowed {max_images}")
    return windows


def check_amplitude_bank(
    dxo: DXO | None,
    half_widths: tuple[int, int] | None = None,
    max_half_width: int = DEFAULT_MAX_HALF_WIDTH,
    known_sites: Iterable[str] | None = None,
) -> dict[str, np.ndarray]:
    """The bank a site receives: site -> windows of one declared shape, from known sites only."""
    if dxo is None or dxo.data_kind != AMPLITUDE_BANK:
        raise PayloadRejected(f"expected a DXO of kind {AMPLITUDE_BANK}, got {getattr(dxo, 'data_kind', None)}")
    if not isinstance(dxo.data, dict) or not dxo.data:
        raise PayloadRejected("the amplitude bank is empty")
    _check_meta(dxo, ("payload", "half_widths"))
    declared = _declared_half_widths(dxo.get_meta_prop("half_widths"))
    _check_half_widths(declared, half_widths, max_half_width)
    if known_sites is not None:
        unknown = sorted(set(map(str, dxo.data)) - set(known_sites))
        if unknown:
            raise PayloadRejected(f"the bank names unknown sites {unknown}")
    bank = {str(site): check_window_array(a, declared, f"bank entry {site!r}") for site, a in dxo.data.items()}
    if len({a.shape[1] for a in bank.values()}) > 1:
        raise PayloadRejected("bank entries disagree in their number of channels")
    return bank


# ---------------------------------------------------------------------------------------------- MLA feature bank


def feature_request_dxo(
    encoder: str,
    max_images: int | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    in_channels: int | None = None,
    seed: int | None = None,
    width: int | None = None,
    depth: int | None = None,
) -> DXO:
    """The ``mla_features`` task data: the random encoder's recipe, or the global model's weights."""
    meta: dict[str, Any] = {"payload": "mla_encoder", "encoder": encoder,
                            "max_images": None if max_images is None else int(max_images)}
    if encoder == "random":
        meta.update(in_channels=int(in_channels), seed=int(seed), width=int(width), depth=int(depth))
        return DXO(data_kind=MLA_ENCODER, data={}, meta=meta)
    if encoder == "global":
        if not weights:
            raise ValueError("the global model's encoder needs the final global weights")
        return DXO(data_kind=MLA_ENCODER, data={k: np.asarray(v) for k, v in weights.items()}, meta=meta)
    raise ValueError(f"unknown encoder {encoder!r}")


def _non_negative_int(value: Any, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PayloadRejected(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_feature_request(dxo: DXO | None) -> dict[str, Any]:
    """The ``mla_features`` task data a site receives; returns its meta (the encoder recipe) with, for the global
    encoder, ``"weights"``: the global model's weights (checked against the network by the site)."""
    if dxo is None or dxo.data_kind != MLA_ENCODER:
        raise PayloadRejected(f"expected a DXO of kind {MLA_ENCODER}, got {getattr(dxo, 'data_kind', None)}")
    meta = dict(dxo.meta or {})
    encoder = meta.get("encoder")
    if meta.get("payload") != "mla_encoder":
        raise PayloadRejected(f"meta 'payload' must be 'mla_encoder', got {meta.get('payload')!r}")
    if meta.get("max_images") is not None:
        _non_negative_int(meta["max_images"], "meta 'max_images'", 1)
    if encoder == "random":
        _check_meta(dxo, ("payload", "encoder", "max_images", "in_channels", "seed", "width", "depth"))
        if dxo.data:
            raise PayloadRejected("the random encoder's request carries data; it must carry its recipe only")
        for key, minimum in (("in_channels", 1), ("seed", 0), ("width", 1), ("depth", 1)):
            _non_negative_int(meta.get(key), f"meta {key!r}", minimum)
        return {k: v for k, v in meta.items() if k not in _NVFLARE_META}
    if encoder == "global":
        _check_meta(dxo, ("payload", "encoder", "max_images"))
        if not isinstance(dxo.data, dict) or not dxo.data:
            raise PayloadRejected("the global model's encoder request carries no weights")
        if not all(isinstance(v, np.ndarray) for v in dxo.data.values()):
            raise PayloadRejected("the global model's weights must be numpy arrays")
        return {**{k: v for k, v in meta.items() if k not in _NVFLARE_META}, "weights": dxo.data}
    raise PayloadRejected(f"meta 'encoder' must be 'random' or 'global', got {encoder!r}")


def feature_matrix_dxo(features: np.ndarray) -> DXO:
    """The ``mla_features`` result: one float32 row of features per image, nothing else."""
    features = np.ascontiguousarray(features, dtype=np.float32)
    if features.ndim != 2:
        raise ValueError(f"expected a (images, features) matrix, got shape {features.shape}")
    return DXO(data_kind=FEATURE_MATRIX, data={_FEATURES_KEY: features},
               meta={"payload": "feature_matrix", "num_images": int(features.shape[0]),
                     "width": int(features.shape[1])})


def check_feature_payload(
    dxo: DXO | None,
    width: int | None = None,
    max_width: int | None = None,
    max_rows: int | None = None,
) -> np.ndarray:
    """The result of the ``mla_features`` task is exactly the declared feature matrix; returns it.

    Args:
        dxo: the result's DXO.
        width: the job's exact feature width, or None (a site policy) to accept any width up to ``max_width``.
        max_width: the widest feature vector a site lets out (a vector as wide as an image could carry the image).
        max_rows: the most images whose features may leave the site; None: no cap.
    """
    if dxo is None or dxo.data_kind != FEATURE_MATRIX:
        raise PayloadRejected(f"expected a DXO of kind {FEATURE_MATRIX}, got {getattr(dxo, 'data_kind', None)}")
    if not isinstance(dxo.data, dict) or set(dxo.data) != {_FEATURES_KEY}:
        keys = sorted(map(str, dxo.data)) if isinstance(dxo.data, dict) else type(dxo.data).__name__
        raise PayloadRejected(f"expected exactly the data key {_FEATURES_KEY!r}, got {keys}")
    _check_meta(dxo, ("payload", "num_images", "width"))
    if dxo.get_meta_prop("payload") != "feature_matrix":
        raise PayloadRejected(f"meta 'payload' must be 'feature_matrix', got {dxo.get_meta_prop('payload')!r}")
    x = dxo.data[_FEATURES_KEY]
    if isinstance(x, np.ndarray) and x.dtype != np.float32:
        raise PayloadRejected(f"feature matrix: expected float32, got {x.dtype}")
    try:
        check_feature_matrix(x, width, max_rows)
    except ValueError as e:
        raise PayloadRejected(str(e)) from None
    if max_width is not None and x.shape[1] > max_width:
        raise PayloadRejected(f"feature matrix: {x.shape[1]} features per image exceed the allowed {max_width} "
                              f"(a feature vector, not an image)")
    if dxo.get_meta_prop("width") != x.shape[1]:
        raise PayloadRejected(f"meta width {dxo.get_meta_prop('width')!r} differs from the {x.shape[1]} features sent")
    if dxo.get_meta_prop("num_images") != x.shape[0]:
        raise PayloadRejected(f"meta num_images {dxo.get_meta_prop('num_images')!r} differs from the {x.shape[0]} "
                              f"rows sent")
    return x


def mla_bundle_dxo(payload: Mapping[str, Any]) -> DXO:
    """The ``mla_evaluate`` task data: a bundle payload (:func:`feddg.mla_bundle.bundle_to_payload`)."""
    return DXO(data_kind=MLA_BUNDLE, data=dict(payload), meta={"payload": "mla_bundle"})
