"""MLA (MLA-BIN, section 2.2) after federated training: the domain feature bank, the domain attention module (DAM),
the MLA bundle, and the evaluation of the attention-combined model at every site.

List it in ``workflows`` after :class:`feddg.flare.controller.LeaveOneSiteOutFedAvg`, whose final round hands its
results to a :class:`~feddg.flare.mla.local_models.LocalModelKeeper` (``final_round_receiver_id``; it keeps the final
local model of every training site that opted in):

1. **Who takes part.** The training sites whose final local model the server kept. A site that did not opt in
   (``"share_local_model": true`` in its own ``local/feddg_site.json``) is named in the log with how to opt in, and
   is asked for nothing: its features would be of no use without its model.
2. ``mla_features`` to those sites. Task data (DXO ``MLA_ENCODER``): the shared encoder of Eq. (2), identical at
   every site: by default the recipe of a seeded random CNN (kind, seed, sizes; each site builds it), or with
   ``mla.encoder: global`` the final global model's weights (read through the persistor's ``FL_global_model.pt``,
   the model the FedAvg workflow saved last). Result (DXO ``FEATURE_MATRIX``, guarded at the site by
   :class:`feddg.flare.mla.filter.FeatureMatrixFilter`): a float32 (images x features) matrix and its count.
3. The server checks each matrix (:func:`feddg.flare.mla.payloads.check_feature_payload`). A site that sent no valid
   features is left out of the DAM with a warning, and its local model out of the combination. With fewer than
   two usable sites MLA is skipped with a message that says why; the job still succeeds with its FedAvg results.
4. The DAM is trained on the bank (:func:`feddg.methods.mla.attention.train_domain_attention`, ``mla.attention_*``); its
   accuracy on the bank (overall and per site) goes to the log and the report. The MLA bundle (local models,
   encoder, DAM; :func:`feddg.flare.mla.bundle.save_bundle`) is written to ``<run folder>/mla_bundle/``, which
   ``nvflare job download`` and the simulator workspace contain.
5. ``mla_evaluate`` to every site, the unseen one included. Task data (DXO ``MLA_BUNDLE``): the bundle's payload
   form (:func:`feddg.flare.mla.bundle.bundle_to_payload`). Each site weights the local models by the DAM's output
   on its own evaluation images (Eq. 4) and scores the combination (the paper applies the DAM to the unseen
   domain's data "on the server"; here the bundle goes to the data, so no image of the unseen site leaves it); the
   server adds the model ``"mla"`` to ``feddg_report.json`` (``models["mla"]``, table rows after final / best, and
   an ``mla`` section with the attention weights per site, the DAM's accuracy and the sites that took part) and
   prints the table, with the unseen site's final / best / MLA metrics side by side.

What leaves a site in this workflow: one feature vector per training image (step 2) and metric summaries with the
site's attention weights (step 5).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import torch
from nvflare.apis.controller_spec import ClientTask, Task
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.model import ModelLearnableKey
from nvflare.app_common.app_constant import AppConstants, DefaultCheckpointFileName

from feddg.flare.constants import CONFIG_FILE
from feddg.flare.controller import stream_rows
from feddg.flare.mla.bundle import bundle_to_payload, load_bundle, save_bundle
from feddg.flare.mla.executor import MLA_MODEL_NAME
from feddg.flare.mla.local_models import LOCAL_MODELS_DIR, LocalModelStore, OPT_IN_HINT
from feddg.flare.mla.settings import mla_feature_width, random_feature_encoder
from feddg.flare.mla.payloads import (
    MLATask,
    attention_weight_split,
    check_feature_payload,
    feature_request_dxo,
    mla_bundle_dxo,
)
from feddg.flare.payloads import PayloadRejected
from feddg.flare.phase import ServerPhase
from feddg.jsonfile import read_json
from feddg.methods.mla.attention import site_accuracy, train_domain_attention
from feddg.methods.mla.encoders import global_model_encoder
from feddg.nets.unet import build_model
from feddg.report import REPORT_FILE, compare_models, evaluation_rows, format_table, write_report

BUNDLE_DIR = "mla_bundle"


class MLAWorkflow(ServerPhase):
    """The feature bank, the domain attention module, the MLA bundle and its evaluation at every site.

    Args:
        config_file: the job's ``feddg.yaml`` (sites, unseen site, the ``mla`` section).
        features_task_name: the task that asks the training sites for their feature matrices.
        evaluate_task_name: the task that delivers the bundle to every site for evaluation.
        persistor_id: the model persistor (the final global model, for ``mla.encoder: global``).
        bundle_dir: the bundle's folder in the server's run folder.
        report_file: the report that :class:`~feddg.flare.controller.LeaveOneSiteOutFedAvg` wrote in the run
            folder; the MLA results are added to it.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        features_task_name: str = MLATask.MLA_FEATURES,
        evaluate_task_name: str = MLATask.MLA_EVALUATE,
        persistor_id: str = AppConstants.DEFAULT_PERSISTOR_ID,
        bundle_dir: str = BUNDLE_DIR,
        report_file: str = REPORT_FILE,
    ):
        super().__init__(config_file)
        self.features_task_name = features_task_name
        self.evaluate_task_name = evaluate_task_name
        self.persistor_id = persistor_id
        self.bundle_dir = bundle_dir
        self.report_file = report_file

    # ------------------------------------------------------------------ the workflow
    def control_flow(self, abort_signal: Signal, fl_ctx: FLContext) -> None:
        started = time.time()
        cfg = self.cfg
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        summary: dict[str, Any] = {"encoder": cfg.mla.encoder, "attention_mode": cfg.mla.attention_mode,
                                   "sites": [], "left_out": {}, "skipped": None}
        store = LocalModelStore(os.path.join(run_dir, LOCAL_MODELS_DIR))
        kept = self._kept_sites(store, summary["left_out"], fl_ctx)
        if len(kept) < 2:
            self._skip(fl_ctx, run_dir, summary, f"MLA needs the local models of at least two training sites; the "
                                                  f"server kept {kept or 'none'}")
            return
        request, encoder = self._encoder(fl_ctx)
        if request is None:
            self._skip(fl_ctx, run_dir, summary, encoder)
            return
        bank = self._feature_bank(kept, request, summary["left_out"], abort_signal, fl_ctx)
        if abort_signal.triggered:
            return
        if len(bank) < 2:
            self._skip(fl_ctx, run_dir, summary, f"MLA needs at least two sites with a kept local model and feature "
                                                  f"vectors; only {list(bank) or 'none'} qualify")
            return
        attention, order = self._attention(bank, summary, fl_ctx)
        path = save_bundle(os.path.join(run_dir, self.bundle_dir), {s: store.load(s) for s in order}, encoder,
                           attention, cfg, site_order=order, attention_mode=cfg.mla.attention_mode, overwrite=True)
        summary["bundle"] = str(path)
        self.log_info(fl_ctx, f"MLA: wrote the MLA bundle to {path}")
        bundle = load_bundle(path)  # what a hospital will load, checked
        evaluation = self._evaluate_everywhere(bundle, summary, abort_signal, fl_ctx)
        if evaluation is None:
            return
        summary["wall_time_s"] = round(time.time() - started, 1)
        self._report(fl_ctx, run_dir, summary, evaluation)

    # ------------------------------------------------------------------ steps
    def _kept_sites(self, store: LocalModelStore, left_out: dict[str, str], fl_ctx: FLContext) -> list[str]:
        """Step 1: the training sites whose final local model the server kept; the others named in ``left_out``."""
        cfg = self.cfg
        kept = [s for s in cfg.data.train_sites if s in set(store.sites())]
        declined = set(store.declined())
        for site in cfg.data.train_sites:
            if site in kept:
                continue
            if site in declined:
                left_out[site] = "did not opt in to share its local model"
                self.log_warning(fl_ctx, f"MLA: site {site} did not opt in to share its local model; it is left out "
                                         f"of MLA ({OPT_IN_HINT})")
            else:
                left_out[site] = "no local model kept from the final round"
                self.log_warning(fl_ctx, f"MLA: the server kept no final-round local model of site {site} (no "
                                         f"usable final update, or the job does not keep local models); it is left "
                                         f"out of MLA ({OPT_IN_HINT} if it has not)")
        return kept

    def _feature_bank(self, kept: list[str], request, left_out: dict[str, str], abort_signal: Signal,
                      fl_ctx: FLContext) -> dict[str, np.ndarray]:
        """Step 2: site -> its checked feature matrix, from the kept sites that sent one; the others named in
        ``left_out``."""
        cfg = self.cfg
        width = mla_feature_width(cfg)
        self.log_info(fl_ctx, f"MLA: asking {kept} for the feature vectors of their training images ({width} values "
                              f"each, {cfg.mla.encoder} encoder)")
        ask = Task(name=self.features_task_name, data=request.to_shareable(), timeout=cfg.mla.features_timeout)
        self.broadcast_and_wait(ask, fl_ctx, targets=kept, min_responses=len(kept), abort_signal=abort_signal)
        bank: dict[str, np.ndarray] = {}
        answered = {}
        for client_task in ask.client_tasks:
            site, features, reason = self._accept_features(client_task, width)
            answered[site] = reason
            if features is not None:
                bank[site] = features
        for site in kept:
            if site in bank:
                continue
            reason = answered.get(site) or "no answer"
            left_out[site] = f"sent no feature vectors ({reason})"
            self.log_warning(fl_ctx, f"MLA: site {site} sent no feature vectors ({reason}); it is left out of the "
                                     f"domain attention module and its local model out of the combination")
        return {s: bank[s] for s in kept if s in bank}

    def _attention(self, bank: dict[str, np.ndarray], summary: dict[str, Any], fl_ctx: FLContext):
        """Step 3: the domain attention module trained on the bank; (module, site order). Its accuracy goes to the
        log and ``summary``."""
        m = self.cfg.mla
        attention, order, accuracy = train_domain_attention(
            bank, epochs=m.attention_epochs, lr=m.attention_lr, seed=m.attention_seed,
            batch_size=m.attention_batch_size, conv_channels=m.attention_conv_channels, hidden=m.attention_hidden,
        )
        by_site = site_accuracy(attention, bank, order)
        per_site = ", ".join(f"{s} {a:.3f}" for s, a in by_site.items())
        self.log_info(fl_ctx, f"MLA: domain attention module trained on {sum(len(bank[s]) for s in order)} feature "
                              f"vectors of {order} ({m.attention_epochs} epochs); accuracy on the bank "
                              f"{accuracy:.3f} (per site: {per_site})")
        summary.update(sites=order, attention_accuracy=accuracy, attention_site_accuracy=by_site,
                       feature_images={s: int(len(bank[s])) for s in order}, feature_width=mla_feature_width(self.cfg))
        return attention, order

    def _evaluate_everywhere(self, bundle, summary: dict[str, Any], abort_signal: Signal,
                             fl_ctx: FLContext) -> dict[str, Any] | None:
        """Step 5: the attention-combined model scored at every site; the evaluation in the report's form (None
        when aborted). The sites' attention weights go to ``summary``."""
        cfg = self.cfg
        sites = list(cfg.data.sites)
        self.log_info(fl_ctx, f"MLA: evaluating the attention-combined model at {sites}")
        evaluate = Task(name=self.evaluate_task_name, data=mla_bundle_dxo(bundle_to_payload(bundle)).to_shareable(),
                        timeout=cfg.mla.eval_timeout)
        self.broadcast_and_wait(evaluate, fl_ctx, targets=sites, min_responses=len(sites), abort_signal=abort_signal)
        if abort_signal.triggered:
            return None
        evaluation: dict[str, Any] = {"rounds_trained": cfg.train.rounds, "sites": {}, "missing_sites": []}
        weights: dict[str, Any] = {}
        for client_task in evaluate.client_tasks:
            site = client_task.client.name
            metrics, meta, problem = _metrics_of(client_task.result)
            if problem:
                self.log_error(fl_ctx, f"MLA: evaluation at site {site}: {problem}")
                continue
            evaluation["sites"][site] = {"role": cfg.data.role(site), "splits": metrics}
            source = attention_weight_split(cfg.data.role(site), metrics)
            weights[site] = {"weights": meta.get("attention_weights"), "from": source,
                             "n_images": (metrics.get(source) or {}).get("n_images"), "mode": cfg.mla.attention_mode}
        evaluation["missing_sites"] = sorted(set(sites) - set(evaluation["sites"]))
        if evaluation["missing_sites"]:
            self.log_error(fl_ctx, f"MLA: no metrics of the combined model from {evaluation['missing_sites']}")
        summary["attention_weights"] = weights
        return evaluation

    # ------------------------------------------------------------------ parts
    def _encoder(self, fl_ctx: FLContext):
        """(task data, encoder module) for the configured encoder, or (None, reason)."""
        cfg = self._cfg
        m = cfg.mla
        if m.encoder == "random":
            encoder = random_feature_encoder(cfg)
            return feature_request_dxo("random", m.feature_images, **encoder.hparams()), encoder
        weights = self._final_global_weights(fl_ctx)
        if weights is None:
            return None, ("mla.encoder is 'global' but the final global model is not available from the persistor "
                          f"{self.persistor_id!r}")
        model = build_model(cfg)
        try:
            model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()}, strict=True)
        except RuntimeError as e:
            return None, f"the final global model does not fit the configured network: {e}"
        return feature_request_dxo("global", m.feature_images, weights=weights), global_model_encoder(model)

    def _final_global_weights(self, fl_ctx: FLContext) -> dict[str, np.ndarray] | None:
        """The last global model the FedAvg workflow saved (the persistor's ``FL_global_model.pt``)."""
        persistor = fl_ctx.get_engine().get_component(self.persistor_id)
        if persistor is None or not hasattr(persistor, "get_model"):
            return None
        name = getattr(persistor, "global_model_file_name", DefaultCheckpointFileName.GLOBAL_MODEL)
        learnable = persistor.get_model(name, fl_ctx)
        if not learnable:
            return None
        weights = learnable.get(ModelLearnableKey.WEIGHTS)
        return {k: np.asarray(v) for k, v in weights.items()} if weights else None

    def _accept_features(self, client_task: ClientTask, width: int):
        """(site, features or None, reason when None)."""
        site = client_task.client.name
        result = client_task.result
        problem = reply_problem(result)
        if problem is not None:
            return site, None, problem
        try:
            features = check_feature_payload(from_shareable(result), width, max_rows=self._cfg.mla.feature_images)
        except (PayloadRejected, ValueError) as e:
            return site, None, f"rejected: {e}"
        if len(features) == 0:
            return site, None, "an empty feature matrix"
        return site, features, None

    def _skip(self, fl_ctx: FLContext, run_dir: str, summary: dict[str, Any], reason: str) -> None:
        summary["skipped"] = reason
        self.log_warning(fl_ctx, f"MLA skipped: {reason}. The job's FedAvg results stand.")
        self._report(fl_ctx, run_dir, summary, None)

    def _report(self, fl_ctx: FLContext, run_dir: str, summary: dict[str, Any], evaluation: dict | None) -> None:
        """Add the MLA results to the FedAvg workflow's report and print the table."""
        cfg = self._cfg
        path = os.path.join(run_dir, self.report_file)
        report = read_json(path)
        if not report:
            self.log_warning(fl_ctx, f"MLA: no report of the federated rounds in {path}; writing the MLA results "
                                     f"alone")
        report["mla"] = summary
        if evaluation is None:
            write_report(path, report)
            print(f"\nMLA skipped: {summary['skipped']} (JSON: {path})\n", flush=True)
            return
        report.setdefault("models", {})[MLA_MODEL_NAME] = evaluation
        report["reported_model"] = MLA_MODEL_NAME  # MLA-BIN's result is the attention-combined model
        order = [*cfg.data.train_sites, cfg.data.unseen_site]
        rows = [r for r in report.get("table", []) if r.get("model") != MLA_MODEL_NAME]
        mla_rows = evaluation_rows({MLA_MODEL_NAME: evaluation}, order, cfg.data.label_names)
        report["table"] = rows + mla_rows
        write_report(path, report)
        stream_rows(self, fl_ctx, mla_rows, cfg.train.rounds)
        unseen = cfg.data.unseen_site
        headline = compare_models(report["table"], unseen, "test", ["final", "best", MLA_MODEL_NAME])
        w = summary["attention_weights"].get(unseen, {}).get("weights") or {}
        weights = ", ".join(f"{s} {v:.3f}" for s, v in w.items())
        text = (f"MLA at the unseen site {unseen} (models final / best / {MLA_MODEL_NAME}):\n  "
                + "\n  ".join(headline)
                + f"\n  attention weights at {unseen}: {weights}"
                + f"\n  domain attention accuracy on the feature bank: {summary['attention_accuracy']:.3f}")
        self.log_info(fl_ctx, f"MLA report (also in {path}):\n{format_table(report['table'])}\n{text}")
        print(f"\nFedDG report with MLA, unseen site {unseen} (JSON: {path}; bundle: {summary['bundle']})\n"
              f"{format_table(report['table'])}\n{text}\n", flush=True)


def reply_problem(result: Shareable | None) -> str | None:
    """Why a site's reply holds nothing to read ("no answer", or the return code it answered with), or None."""
    if result is None:
        return "no answer"
    rc = result.get_return_code(ReturnCode.OK)
    return None if rc == ReturnCode.OK else f"answered with {rc}"


def _metrics_of(result: Shareable | None):
    """(metrics, meta, problem) of an ``mla_evaluate`` reply."""
    problem = reply_problem(result)
    if problem is not None:
        return None, None, problem
    try:
        dxo = from_shareable(result)
    except ValueError as e:
        return None, None, f"malformed reply: {e}"
    if not isinstance(dxo.data, dict) or not dxo.data:
        return None, None, "returned no metrics"
    meta = dict(dxo.meta or {})
    weights = meta.get("attention_weights")
    if not isinstance(weights, dict) or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                                for v in weights.values()):
        meta["attention_weights"] = None
    return dxo.data, meta, None
