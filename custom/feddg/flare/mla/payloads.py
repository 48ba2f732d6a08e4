"""The payloads of MLA's feature bank and evaluation, their builders and their checks (used by the site that sends
them, the job's :class:`~feddg.flare.mla.filter.FeatureMatrixFilter`, the site's egress filter and the server's
workflow alike).

  * data of the ``mla_features`` task, DXO kind ``MLA_ENCODER``: the shared encoder of Eq. (2), as a recipe
      random encoder: data {}, meta {"payload": "mla_encoder", "encoder": "random", "in_channels": C, "seed": s,
                                      "width": w, "depth": d, "max_images": n or None}
      global model's encoder: data {the final global model's weights}, meta {"payload": "mla_encoder",
                                      "encoder": "global", "max_images": n or None}
  * result of the ``mla_features`` task, DXO kind ``FEATURE_MATRIX``:
      data {"features": float32 (N, F), finite}
      meta {"payload": "feature_matrix", "num_images": N, "width": F}
  * data of the ``mla_evaluate`` task, DXO kind ``MLA_BUNDLE``: the MLA bundle in its payload form
      (:func:`feddg.flare.mla.bundle.bundle_to_payload`: manifest, local models, encoder, attention module), checked
      at the site with :func:`feddg.flare.mla.bundle.bundle_from_payload`. Result: DXO ``METRICS`` as for
      ``evaluate``, meta {"model_name": "mla", "attention_weights": {site: D^w_i}} (:func:`check_mla_evaluate_result`)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO

from feddg.flare.payloads import (EVALUATE_META, NVFLARE_META, PayloadRejected, check_declared_meta,
                                  check_scalar_meta, check_split_summaries, required)
from feddg.flare.mla.names import DEFAULT_MAX_FEATURE_WIDTH, SHARE_LOCAL_MODEL, MLATask  # noqa: F401 - MLA's names
from feddg.methods.mla.features import check_feature_matrix



MLA_ENCODER = "MLA_ENCODER"
MLA_BUNDLE = "MLA_BUNDLE"
FEATURE_MATRIX = "FEATURE_MATRIX"
_FEATURES_KEY = "features"
MLA_EVALUATE_META = EVALUATE_META | {"attention_weights", "attention_sites"}


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
        check_declared_meta(dxo, ("payload", "encoder", "max_images", "in_channels", "seed", "width", "depth"))
        if dxo.data:
            raise PayloadRejected("the random encoder's request carries data; it must carry its recipe only")
        for key, minimum in (("in_channels", 1), ("seed", 0), ("width", 1), ("depth", 1)):
            _non_negative_int(meta.get(key), f"meta {key!r}", minimum)
        return {k: v for k, v in meta.items() if k not in NVFLARE_META}
    if encoder == "global":
        check_declared_meta(dxo, ("payload", "encoder", "max_images"))
        if not isinstance(dxo.data, dict) or not dxo.data:
            raise PayloadRejected("the global model's encoder request carries no weights")
        if not all(isinstance(v, np.ndarray) for v in dxo.data.values()):
            raise PayloadRejected("the global model's weights must be numpy arrays")
        return {**{k: v for k, v in meta.items() if k not in NVFLARE_META}, "weights": dxo.data}
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
    check_declared_meta(dxo, ("payload", "num_images", "width"))
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
    """The ``mla_evaluate`` task data: a bundle payload (:func:`feddg.flare.mla.bundle.bundle_to_payload`)."""
    return DXO(data_kind=MLA_BUNDLE, data=dict(payload), meta={"payload": "mla_bundle"})


def check_mla_evaluate_result(dxo: DXO | None) -> None:
    """The ``mla_evaluate`` result: metric summaries of the attention-combined model and the site's attention
    weights (a short list of scalars in the meta)."""
    dxo = required(dxo)
    check_split_summaries(dxo)
    check_scalar_meta(dxo, MLA_EVALUATE_META, max_list=64)


def attention_weight_split(role: str, splits: Iterable[str]) -> str | None:
    """The split whose images give a site its attention weights D^w in the ``mla_evaluate`` task, among the
    ``splits`` it has: ``test`` at the held-out site, ``val`` at a training site, else the first it has (None:
    none). The site chooses it and the server reports it from the same rule; the result's meta carries only the
    weights."""
    splits = list(splits)
    wanted = "test" if role == "unseen" else "val"
    return wanted if wanted in splits else next(iter(splits), None)

