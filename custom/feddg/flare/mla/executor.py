"""The site's Executor for MLA (MLA-BIN, section 2.2): the opt-in to share the local model, the feature bank and
the evaluation of the attention-combined model.

Tasks, on top of :class:`feddg.flare.executor.FedDGExecutor`'s ``train`` and ``evaluate``:
  * ``train``: as FedAvg's. The result's metadata carries ``share_local_model: true`` only when the site's own
    ``local/feddg_site.json`` says ``"share_local_model": true`` (:mod:`feddg.flare.site_config`): the server keeps
    the final local model of such sites for MLA. A job cannot opt a site in; absent, the site is left out of MLA.
  * ``mla_features``: in (DXO ``MLA_ENCODER``), the shared encoder of Eq. (2): the recipe of the seeded random CNN
    (kind, seed, sizes: the site builds the identical network itself) or the final global model's weights (the
    site uses its encoder). Out (DXO ``FEATURE_MATRIX``): one float32 feature vector per training image, nothing
    else (:func:`feddg.methods.mla.encoders.encode`: the encoder + global average pooling, on the images as the network
    receives them). All training images, or a seeded random subset of ``max_images`` (the job's
    ``mla.feature_images``). The unseen site refuses it.
  * ``mla_evaluate``: in (DXO ``MLA_BUNDLE``), the MLA bundle (local models, encoder, attention module), checked as
    :func:`feddg.flare.mla.bundle.load_bundle` checks a folder. The site computes the attention weights D^w from its
    own evaluation images (the unseen site: its test images; a training site: its validation split), combines
    G = sum_i D^w_i l_i (Eq. 4) and scores G with the ``evaluate`` task's metric code on the same splits. Out: DXO
    ``METRICS`` with the weights {site: D^w_i} in the meta (``attention_weights``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from feddg.flare.constants import FedDGMeta
from feddg.flare.executor import FedDGExecutor, TaskHandler
from feddg.flare.mla.bundle import bundle_from_payload, evaluate_with_bundle
from feddg.flare.mla.payloads import (
    MLATask,
    MLA_BUNDLE,
    SHARE_LOCAL_MODEL,
    attention_weight_split,
    check_feature_request,
    feature_matrix_dxo,
)
from feddg.flare.payloads import PayloadRejected, with_case_scores
from feddg.flare.site_config import load_site_config
from feddg.methods.mla.encoders import build_feature_encoder, encode, global_model_encoder
from feddg.seeds import round_seed

MLA_MODEL_NAME = "mla"


class MLAExecutor(FedDGExecutor):
    """MLA at a site.

    Args:
        features_task_name: the task that asks for the site's feature matrix.
        mla_evaluate_task_name: the task that delivers the MLA bundle for evaluation.
        args, kwargs: :class:`FedDGExecutor`'s arguments (``config_file``, ``tb_writer_id``, ...). Literally
            ``*args, **kwargs``: NVFlare's job export (``fuel/utils/class_utils.py``) reads a base class's
            arguments only then.
    """

    def __init__(
        self,
        features_task_name: str = MLATask.MLA_FEATURES,
        mla_evaluate_task_name: str = MLATask.MLA_EVALUATE,
        *args: Any,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.features_task_name = features_task_name
        self.mla_evaluate_task_name = mla_evaluate_task_name
        self._share_local_model = False
        self.handlers[self.train_task_name] = dataclasses.replace(self.handlers[self.train_task_name],
                                                                  handle=self._train_if_shared)
        self.handlers[features_task_name] = TaskHandler(
            lambda shareable, fl_ctx, _: self._send_features(self.task_dxo(shareable), fl_ctx),
            unseen_site_refuses=True, refusal="it sends no features to the domain feature bank")
        self.handlers[mla_evaluate_task_name] = TaskHandler(
            lambda shareable, fl_ctx, _: self._evaluate_bundle(self.task_dxo(shareable), fl_ctx))

    def _train_if_shared(self, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        """Training as usual; the site's own file decides, read afresh for every round, whether the result is
        flagged for the server to keep."""
        self._share_local_model = load_site_config(fl_ctx).share_local_model
        return self._train_task(shareable, fl_ctx, abort_signal)

    # ------------------------------------------------------------------ train
    def _extra_train_meta(self, fl_ctx: FLContext) -> dict[str, Any]:
        return {SHARE_LOCAL_MODEL: True} if self._share_local_model else {}

    # ------------------------------------------------------------------ feature bank
    def _send_features(self, dxo: DXO, fl_ctx: FLContext) -> Shareable:
        cfg, site = self._cfg, self._site
        try:
            request = check_feature_request(dxo)
        except PayloadRejected as e:
            self.log_error(fl_ctx, f"site {site}: refused the feature request: {e}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        if request["encoder"] == "random":
            if request["in_channels"] != cfg.data.in_channels:
                self.log_error(fl_ctx, f"site {site}: refused the feature request: the encoder takes "
                                       f"{request['in_channels']} channel(s), the images have {cfg.data.in_channels}")
                return make_reply(ReturnCode.BAD_TASK_DATA)
            encoder = build_feature_encoder(request["in_channels"], request["seed"], width=request["width"],
                                            depth=request["depth"])
            what = f"the random encoder (seed {request['seed']})"
        else:
            try:
                model = self._load_weights(request["weights"])
            except (RuntimeError, KeyError, ValueError) as e:
                self.log_error(fl_ctx, f"site {site}: refused the feature request: the global weights do not fit "
                                       f"the configured network: {e}")
                return make_reply(ReturnCode.BAD_TASK_DATA)
            encoder = global_model_encoder(model)
            what = "the final global model's encoder"
        train = self._data["train"]
        n = len(train)
        rows = np.arange(n)
        cap = request.get("max_images")
        if cap is not None and cap < n:
            rng = np.random.default_rng(round_seed(cfg.mla.encoder_seed, site, 0))
            rows = np.sort(rng.choice(n, size=cap, replace=False))
        features = encode(encoder.to(self._device), train.images[rows], batch_size=cfg.eval.batch_size)
        self.log_info(fl_ctx, f"site {site}: sending the feature vectors of {len(rows)} of {n} training images "
                              f"({features.shape[1]} values each, from {what})")
        return feature_matrix_dxo(features).to_shareable()

    # ------------------------------------------------------------------ evaluation
    def _evaluate_bundle(self, dxo: DXO, fl_ctx: FLContext) -> Shareable:
        cfg, site = self._cfg, self._site
        if dxo.data_kind != MLA_BUNDLE:
            self.log_error(fl_ctx, f"site {site}: expected an MLA bundle ({MLA_BUNDLE}), got {dxo.data_kind}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        try:
            bundle = bundle_from_payload(dxo.data)
        except ValueError as e:
            self.log_error(fl_ctx, f"site {site}: refused the MLA bundle: {e}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        if bundle.config.data.in_channels != cfg.data.in_channels:
            self.log_error(fl_ctx, f"site {site}: refused the MLA bundle: its network takes "
                                   f"{bundle.config.data.in_channels} channel(s), the images have "
                                   f"{cfg.data.in_channels}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        splits = {name: self._data[name] for name in ("val", "test") if len(self._data[name])}
        weight_split = attention_weight_split(cfg.data.role(site), splits)
        if weight_split is None:
            self.log_error(fl_ctx, f"site {site}: no validation or test images to evaluate the MLA model on")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        metrics, info = evaluate_with_bundle(bundle, splits, weight_split, self._device, cfg.eval.batch_size,
                                             cfg.eval.largest_component)
        share_cases = load_site_config(fl_ctx).share_case_scores
        metrics = {split: with_case_scores({"summary": summary, "cases": info["cases"][split]},
                                           cfg.data.label_names, share_cases) for split, summary in metrics.items()}
        weights = ", ".join(f"{s} {w:.3f}" for s, w in info["weights"].items())
        self.log_info(fl_ctx, f"site {site}: MLA attention weights from {info['n_images']} {weight_split} images "
                              f"({info['mode']}): {weights}; evaluated the combined model on {sorted(metrics)}")
        # The split that gave the weights follows from the site's role, and the mode from the bundle: the meta
        # carries the weights only (what the sites' egress policy admits for this task).
        meta = {FedDGMeta.MODEL_NAME: MLA_MODEL_NAME, "attention_weights": info["weights"]}
        return DXO(data_kind=DataKind.METRICS, data=metrics, meta=meta).to_shareable()
