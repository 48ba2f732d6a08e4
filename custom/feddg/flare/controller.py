"""The server workflow: federated rounds on the training sites, then evaluation at every site.

NVFlare 2.9's FedAvg samples from *all* connected clients and waits forever by default. In leave-one-site-out
evaluation the unseen hospital is a real client that must never train, so this workflow sends ``train`` to the
training sites named in ``feddg.yaml`` only, with a per-round minimum of sites and a timeout, and sends
``evaluate`` to every site (the unseen one included) at the end.

Over the wire:
  * ``train`` task: the global weights (DXO WEIGHTS). Result: the site's weights, or weight differences, with
    metadata ``num_train_samples``, ``val_dice``/``val_loss`` of the *received* model on the site's validation
    split, and ``train_loss``, plus what the method adds. A method that needs the final round's results themselves
    (MLA keeps the local models of the sites that opted in) names a :class:`FinalRoundReceiver` component.
  * ``evaluate`` task: a model's weights with metadata ``model_name`` and ``model_round``. Result: DXO METRICS,
    one summary (Dice/HD95/ASD per structure, mean and std) per split of the site's data.
  * every task (``site_info`` included) carries the run's id (``feddg_run_id``, drawn at start), and every result
    the id of the run its site process serves (:class:`~feddg.flare.executor.FedDGExecutor`). A result of another
    run is named and left out: NVFlare's simulator calls every job ``simulate_job``, so on a host that runs several
    simulators (the benchmark's ``--parallel``, tests) the id is what tells this run's site from another run's
    process that answers under the same name.

A site NVFlare declares disconnected (no heartbeat for the server kit's ``heart_beat_timeout``, then the job's
``dead_client_grace_period``: 600 s + 60 s by default) is sent no more tasks until it comes back; the report names it
and the round it was lost in (``lost_sites``), and its evaluation is reported missing, never scored.

Each round's entry of the report's history carries, under ``aggregation``, the aggregate's metadata: what the
method's aggregator reports about the round (GA: weights, gaps and step; gradient alignment: its corrections), only
the JSON-safe values, read without knowing the method.

Best model: the global model with the highest mean validation Dice over the training sites' validation splits
(each site's mean over its cases, then the plain mean over sites). The unseen site never selects a model.

Why one module: NVFlare runs a workflow as one Controller, and its parts (the site check, the rounds, a lost site,
the final evaluation, the report) read and write one state of the run: the sites, the round, the models, the
report.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from nvflare.apis.analytix import AnalyticsDataType
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.utils.analytix_utils import create_analytic_dxo, send_analytic_dxo
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_common.workflows.base_fedavg import BaseFedAvg

from feddg.config import FedDGConfig
from feddg.evaluation import mean_dice
from feddg.flare.constants import (CONFIG_FILE, PROGRESS_FILE, SIMULATOR_JOB, TASK_CHECK_PERIOD, FedDGMeta,
                                  FedDGTask)
from feddg.flare.job_config import load_job_config
from feddg.flare.site_info import mismatch
from feddg.flare.timings import TIMINGS_FILE, append_timing, peak_rss_mib
from feddg.flare.updates import UpdateRejected, check_update
from feddg.jsonfile import json_safe, write_json
from feddg.numerics import numerics
from feddg.report import REPORT_FILE, evaluation_rows, format_table, mean_of, software_versions, write_report


# After every round the workflow saves the global model (through the persistor), then writes PROGRESS_FILE with the
# rounds behind it. Both carry the same run id (FedDGMeta.RUN_ID) and round count (the model in its metadata, which
# the persistor stores with the weights as the checkpoint's ``meta_props``), so that `feddg resume-job` can tell a
# progress file and a checkpoint of the same save from two that do not belong together.
ROUNDS_COMPLETED = "feddg_rounds_completed"  # model metadata key: the rounds behind the saved model
NR_AGGREGATED = "nr_aggregated"  # NVFlare's aggregate metadata key: how many results it averages


@runtime_checkable
class FinalRoundReceiver(Protocol):
    """A server component that receives each training result of the final round the moment it arrives (before the
    round aggregates it), and hears of the ones the round then rejects."""

    def receive(self, result: FLModel, sent: Mapping[str, Any], round_: int) -> None:
        """``result``: a site's training result; ``sent``: the global weights the round sent."""

    def discard(self, site: str) -> None:
        """The round rejected ``site``'s update: forget what :meth:`receive` kept of it."""


class LeaveOneSiteOutFedAvg(BaseFedAvg):
    """FedAvg over the training sites, best-model selection on their validation splits, and a final
    evaluation of the final and the best global model at every site.

    Args:
        config_file: the job's ``feddg.yaml`` (sites, unseen site, rounds, minimum sites, timeout).
        aggregator_id: a :class:`ModelAggregator` component (FedAvg by data size, GA, ...).
        persistor_id: the model persistor (keeps the last and the best global model).
        start_round: first round to run, to resume a job from a checkpoint.
        report_file: name of the JSON report written in the server's run folder.
        final_round_receiver_id: a :class:`FinalRoundReceiver` component that receives the final round's results
            as they arrive (MLA's :class:`~feddg.flare.mla.local_models.LocalModelKeeper`); None: no such component.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        aggregator_id: str = "aggregator",
        persistor_id: str = AppConstants.DEFAULT_PERSISTOR_ID,
        start_round: int = 0,
        report_file: str = REPORT_FILE,
        final_round_receiver_id: str | None = None,
    ):
        super().__init__(persistor_id=persistor_id, start_round=start_round, task_check_period=TASK_CHECK_PERIOD)
        self.config_file = config_file
        self.aggregator_id = aggregator_id
        self.report_file = report_file
        self.final_round_receiver_id = final_round_receiver_id
        self.final_round_receiver: FinalRoundReceiver | None = None
        self.aggregator: ModelAggregator | None = None
        self._best: dict[str, Any] = {"round": None, "score": -math.inf, "params": None}
        self._history: list[dict[str, Any]] = []
        self._run_id = uuid.uuid4().hex  # job ids do not tell runs apart: every simulator run is "simulate_job"
        self._lost: list[dict[str, Any]] = []  # {"site", "round", "time", "rejoined_round"}: NVFlare's verdicts
        self._lost_lock = threading.Lock()  # written by NVFlare's task monitor thread, read by the workflow

    # ------------------------------------------------------------------ sites NVFlare declares gone
    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        """Record NVFlare's verdicts on a site's connection (fired from its task monitor thread)."""
        super().handle_event(event_type, fl_ctx)
        if event_type == EventType.CLIENT_DISCONNECTED:
            site = fl_ctx.get_prop(FLContextKey.DISCONNECTED_CLIENT_NAME)
            with self._lost_lock:
                self._lost.append({"site": site, "round": self.current_round, "time": time.time(),
                                   "rejoined_round": None})
            self.warning(f"round {self.current_round}: NVFlare declared site {site} disconnected; no more tasks "
                         f"go to it unless it comes back")
        elif event_type == EventType.CLIENT_RECONNECTED:
            site = fl_ctx.get_prop(FLContextKey.RECONNECTED_CLIENT_NAME)
            with self._lost_lock:
                for entry in self._lost:
                    if entry["site"] == site and entry["rejoined_round"] is None:
                        entry["rejoined_round"] = self.current_round
            self.info(f"round {self.current_round}: site {site} is connected again")

    def connected(self, sites: list[str]) -> list[str]:
        """``sites`` without those NVFlare declared disconnected (and that have not come back)."""
        with self._lost_lock:
            gone = {e["site"] for e in self._lost if e["rejoined_round"] is None}
        return [s for s in sites if s not in gone]

    def lost_sites(self) -> list[dict[str, Any]]:
        """A copy of NVFlare's verdicts so far, for the report."""
        with self._lost_lock:
            return [dict(e) for e in self._lost]

    # ------------------------------------------------------------------ workflow
    def run(self) -> None:
        started = time.time()
        cfg = load_job_config(self.fl_ctx, self.config_file)
        self.aggregator = self.get_component(self.aggregator_id)
        if not isinstance(self.aggregator, ModelAggregator):
            self.panic(f"component {self.aggregator_id!r} must be a ModelAggregator, got {type(self.aggregator)}")
            return
        if self.final_round_receiver_id is not None:
            self.final_round_receiver = self.get_component(self.final_round_receiver_id)
            if not isinstance(self.final_round_receiver, FinalRoundReceiver):
                self.panic(f"component {self.final_round_receiver_id!r} must be a FinalRoundReceiver, got "
                           f"{type(self.final_round_receiver)}")
                return
        train_sites = cfg.data.train_sites
        min_sites = cfg.train.min_sites or len(train_sites)
        self.num_rounds = cfg.train.rounds
        self.info(f"training sites {train_sites}, unseen site {cfg.data.unseen_site}, "
                  f"{cfg.train.rounds} rounds, at least {min_sites} sites per round")
        self.fl_ctx.set_prop(AppConstants.NUM_ROUNDS, self.num_rounds, private=True, sticky=False)

        with self._phase("site_info"):
            agreed = self._sites_agree(cfg)
        if not agreed:
            return
        model = self.load_model()
        if not model.params:
            self.panic("the persistor returned no initial model")
            return
        model.start_round, model.total_rounds = self.start_round, self.num_rounds

        for self.current_round in range(self.start_round, self.num_rounds):
            if self.abort_signal.triggered:
                return
            model = self._run_round(model, train_sites, min_sites, cfg)
            if model is None:
                return

        with self._phase("evaluate_final"):
            final_eval = self._evaluate(model.params, "final", self.num_rounds, cfg)
        if final_eval is None:
            return
        self._consider_best(self.num_rounds, model.params, self._mean_val_dice(final_eval, train_sites, cfg))
        evaluations = {"final": final_eval}
        if self._best["round"] == self.num_rounds:
            evaluations["best"] = final_eval
        else:
            with self._phase("evaluate_best"):
                best_eval = self._evaluate(self._best["params"], "best", self._best["round"], cfg)
            if best_eval is None:
                return
            evaluations["best"] = best_eval
        with self._phase("report"):
            self._write_report(cfg, evaluations, time.time() - started)

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Time a part of the run outside the rounds (its start, the evaluations, the report) into the timings file
        (:mod:`feddg.flare.timings`), whether it succeeds or not."""
        record = {"phase": name, "started": time.time()}
        try:
            yield
        finally:
            append_timing(os.path.join(self.get_run_dir(), TIMINGS_FILE), {**record, "ended": time.time()})

    def _sites_agree(self, cfg: FedDGConfig) -> bool:
        """At job start every site reports its ``feddg`` version and preprocessing hash; different answers stop the
        job before the first round, naming the sites. A site that does not answer is named and the job goes on
        (the rounds' minimum of sites decides)."""
        sites = list(cfg.data.sites)
        results = self.broadcast_model(
            data=FLModel(params={}, params_type=ParamsType.FULL, meta={FedDGMeta.RUN_ID: self._run_id}),
            task_name=FedDGTask.SITE_INFO, targets=sites, min_responses=len(sites), timeout=cfg.train.task_timeout,
            wait_time_after_min_received=0,
        )
        fingerprints = {}
        for result in results:
            if not self._of_this_run(result, "job start"):
                continue
            site = result.meta.get("client_name", "?")
            if isinstance(result.metrics, dict) and result.metrics:
                fingerprints[site] = result.metrics
        silent = sorted(set(sites) - set(fingerprints))
        if silent:
            self.warning(f"job start: no version/preprocessing report from {silent}")
        problem = mismatch(fingerprints)
        if problem:
            self.panic(f"job start: {problem}. Install the same feddg release and preprocessing settings at every "
                       f"site; not training.")
            return False
        if fingerprints:
            version, digest = next(iter(fingerprints.values())).values()
            self.info(f"job start: {sorted(fingerprints)} run feddg {version}, preprocessing {digest}")
        return True

    def _run_round(self, model: FLModel, train_sites: list[str], min_sites: int, cfg: FedDGConfig) -> FLModel | None:
        r = self.current_round
        reachable = self.connected(train_sites)  # one snapshot: a verdict may arrive meanwhile
        lost = [s for s in train_sites if s not in reachable]
        train_sites = reachable
        if len(train_sites) < min_sites:
            self.panic(f"round {r}: {len(train_sites)} training site(s) connected ({train_sites}; NVFlare declared "
                       f"{lost} disconnected), the job needs at least {min_sites} (train.min_sites); stopping. The "
                       f"last good global model stays in the persistor's checkpoint.")
            return None
        self.info(f"round {r} of {self.num_rounds}: sending the global model to {train_sites}")
        model.current_round = r
        model.meta = {**(model.meta or {}), FedDGMeta.RUN_ID: self._run_id}  # a resumed job's model names the old run
        self.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, r, private=True, sticky=False)
        if self.aggregator.fl_ctx:  # the aggregator keeps its own context (as in NVFlare's FedAvg)
            self.aggregator.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, r, private=True, sticky=False)
        self.event(AppEventType.ROUND_STARTED)
        timeout = cfg.train.task_timeout
        receiver = self.final_round_receiver if r == self.num_rounds - 1 else None
        timing = {"round": r, "started": time.time(), "results": {}}
        results = self.broadcast_model(
            data=model, task_name=FedDGTask.TRAIN, targets=train_sites, min_responses=min_sites,
            timeout=timeout, wait_time_after_min_received=timeout,
            callback=self._receiving(timing["results"], receiver, r, dict(model.params)),
        )
        timing["results_in"] = time.time()
        aggregation_started = time.perf_counter()
        self.aggregator.reset_stats()
        accepted, val_dice, train_loss = [], {}, {}
        for result in results:
            site = result.meta.get("client_name", "?")
            try:
                check_update(result.params, model.params)
                self.aggregator.accept_model(result)
            except (UpdateRejected, ValueError) as e:
                self.error(f"round {r}: update from site {site} rejected: {e}")
                if receiver is not None:
                    receiver.discard(site)
                continue
            accepted.append(site)
            for key, store in ((FedDGMeta.VAL_DICE, val_dice), (FedDGMeta.TRAIN_LOSS, train_loss)):
                value = result.meta.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    store[site] = float(value)
        missing = sorted(set(train_sites) - {r_.meta.get("client_name") for r_ in results})
        if missing:
            self.warning(f"round {r}: no result from {missing}; aggregating over the sites present")
        if len(accepted) < min_sites:
            self.panic(
                f"round {r}: only {len(accepted)} usable update(s) ({accepted}), the job needs at least {min_sites} "
                f"(train.min_sites); stopping. The last good global model stays in the persistor's checkpoint."
            )
            return None
        self.event(AppEventType.BEFORE_AGGREGATION)
        aggregated = self.aggregator.aggregate_model()
        self.fire_event_with_data(AppEventType.AFTER_AGGREGATION, self.fl_ctx, AppConstants.AGGREGATION_RESULT, aggregated)

        sent = dict(model.params)  # the global model of this round, scored by the sites' val_dice
        self._consider_best(r, sent, mean_of(val_dice.get(s) for s in train_sites))
        self._history.append({"round": r, "sites": accepted, "val_dice": val_dice, "train_loss": train_loss,
                              "mean_val_dice": mean_of(val_dice.values()),
                              "aggregation": aggregation_diagnostics(aggregated)})
        for site, value in val_dice.items():
            self._stream(f"val_dice/{site}", value, r)
        self._stream("val_dice/mean", mean_of(val_dice.values()), r)

        model = self.update_model(model, aggregated)
        model.params = {k: cast_like(v, sent[k]) for k, v in model.params.items()}
        model.meta = {**(model.meta or {}), FedDGMeta.RUN_ID: self._run_id, ROUNDS_COMPLETED: r + 1}
        timing["aggregation_s"] = time.perf_counter() - aggregation_started
        save_started = time.perf_counter()
        self.save_model(model)
        # What a resumed job needs to know (`feddg resume-job`): the rounds behind the saved global model.
        write_json(os.path.join(self.get_run_dir(), PROGRESS_FILE),
                   {"rounds_completed": r + 1, "total_rounds": self.num_rounds, "run_id": self._run_id,
                    "history": self._history})
        timing.update(save_s=time.perf_counter() - save_started, ended=time.time(), peak_rss_mib=peak_rss_mib())
        append_timing(os.path.join(self.get_run_dir(), TIMINGS_FILE), timing)
        return model

    # ------------------------------------------------------------------ each result as it arrives
    def _receiving(self, arrivals: dict[str, float], receiver: FinalRoundReceiver | None, r: int, sent: dict):
        """The per-result callback of a round: it notes when each site's result arrived (the round's timings) and,
        in the final round, hands each result to ``receiver`` the moment it arrives (so a restart of the server
        does not lose what the receiver keeps), then on to the round as usual."""

        def receive(result: FLModel) -> bool:
            if not self._of_this_run(result, f"round {r}"):
                return True  # not collected: the round goes on without it, as without an answer
            arrivals[str(result.meta.get("client_name", "?"))] = time.time()
            # With a callback, NVFlare's blocking broadcast_model returns only what the callback collects into
            # its internal result list; collect it there, so the round sees every result as without a callback.
            self._results.append(result)
            if receiver is None:
                return True
            try:
                receiver.receive(result, sent, r)
            except Exception as e:  # the receiver's failure must not cost the round its update
                self.error(f"round {r}: {self.final_round_receiver_id} failed on the result of site "
                           f"{result.meta.get('client_name', '?')}: {type(e).__name__}: {e}")
            return True

        return receive

    def _of_this_run(self, result: FLModel, step: str) -> bool:
        """Whether ``result`` comes from a site process of this run (its ``feddg_run_id`` is this run's); if not, an
        error names the site, both runs and ``step``, and the caller leaves the result out."""
        served = result.meta.get(FedDGMeta.RUN_ID)
        if served == self._run_id:
            return True
        site = result.meta.get("client_name", "?")
        whose = f"serves run {served}" if served is not None else "names no run"
        self.error(f"{step}: the answer under site {site} comes from a process that {whose}, not this run "
                   f"{self._run_id}: a site process of another run on this host (NVFlare's simulator names every job "
                   f"{SIMULATOR_JOB}) answered as {site}; its answer is left out")
        return False

    # ------------------------------------------------------------------ best model
    def _consider_best(self, rounds_trained: int, params: dict, score: float) -> None:
        """Keep ``params`` as the best model when ``score`` (mean validation Dice) beats the best so far."""
        if not math.isfinite(score) or score <= self._best["score"]:
            return
        self._best = {"round": rounds_trained, "score": score, "params": params}
        self.info(f"new best global model after {rounds_trained} round(s): mean validation Dice {score:.4f}")
        self.fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, make_model_learnable(params, {}), private=True, sticky=True)
        self.event(AppEventType.GLOBAL_BEST_MODEL_AVAILABLE)

    @staticmethod
    def _mean_val_dice(evaluation: dict[str, Any], train_sites: list[str], cfg: FedDGConfig) -> float:
        names = cfg.data.label_names
        per_site = []
        for site in train_sites:
            val = evaluation["sites"].get(site, {}).get("splits", {}).get("val")
            if val:
                per_site.append(mean_dice(val, names))
        return mean_of(per_site)

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, params: dict, name: str, rounds_trained: int, cfg: FedDGConfig) -> dict[str, Any] | None:
        sites = self.connected(list(cfg.data.sites))
        if not sites:  # an empty target list would mean every client to NVFlare
            self.panic(f"evaluation of the {name} model: no site is connected")
            return None
        self.info(f"evaluating the {name} global model (after {rounds_trained} rounds) at {sites}")
        data = FLModel(params=params, params_type=ParamsType.FULL,
                       meta={FedDGMeta.MODEL_NAME: name, FedDGMeta.ROUND: rounds_trained,
                             FedDGMeta.RUN_ID: self._run_id})
        results = self.broadcast_model(
            data=data, task_name=FedDGTask.EVALUATE, targets=sites, min_responses=1,
            timeout=cfg.eval.timeout or cfg.train.task_timeout,
            wait_time_after_min_received=cfg.eval.timeout or cfg.train.task_timeout,
        )
        if len(results) > 1:  # NVFlare 2.9 warns whenever the results outnumber min_responses; here that is wanted
            self.info(f"evaluation of the {name} model: {len(results)} of {len(sites)} sites answered (NVFlare's "
                      f"'Number of results ... expected responses (1)' above is expected: the evaluation needs one "
                      f"answer to go on and waits for every site)")
        evaluation: dict[str, Any] = {"rounds_trained": rounds_trained, "sites": {}, "missing_sites": []}
        for result in results:
            if not self._of_this_run(result, f"evaluation of the {name} model"):
                continue
            site = result.meta.get("client_name", "?")
            if not isinstance(result.metrics, dict) or not result.metrics:
                self.error(f"evaluation of the {name} model: site {site} returned no metrics")
                continue
            evaluation["sites"][site] = {"role": cfg.data.role(site), "splits": result.metrics}
        evaluation["missing_sites"] = sorted(set(cfg.data.sites) - set(evaluation["sites"]))
        if evaluation["missing_sites"]:
            self.error(f"evaluation of the {name} model: no metrics from {evaluation['missing_sites']}")
        if not evaluation["sites"]:
            self.panic(f"evaluation of the {name} model: no site returned metrics")
            return None
        return evaluation

    # ------------------------------------------------------------------ report
    def _write_report(self, cfg: FedDGConfig, evaluations: dict[str, dict], wall_time: float) -> None:
        rows = evaluation_rows(evaluations, [*cfg.data.train_sites, cfg.data.unseen_site], cfg.data.label_names)
        report = {
            "task": cfg.data.task,
            "train_sites": cfg.data.train_sites,
            "unseen_site": cfg.data.unseen_site,
            "rounds": self.num_rounds,
            "best": {"rounds_trained": self._best["round"], "mean_val_dice": self._best["score"],
                     "selected_by": "mean validation Dice over the training sites' validation splits"},
            "models": evaluations,
            "reported_model": "final",  # the model a comparison reports (the papers: the final global model); a
            # method that adds its own model after the rounds names it here (MLA-BIN: "mla")
            "table": rows,
            "history": self._history,
            "lost_sites": self.lost_sites(),
            "config": cfg.to_dict(),
            "seeds": {"split_seed": cfg.data.split_seed, "train_seed": cfg.train.seed,
                      "synthetic_seed": cfg.data.synthetic.seed if cfg.data.root is None else None},
            "versions": software_versions(),
            # the CPU numerics of this process (in the simulator the sites' too: they inherit its environment)
            "numerics": numerics(),
            "wall_time_s": round(wall_time, 1),
        }
        path = os.path.join(self.get_run_dir(), self.report_file)
        write_report(path, report)
        stream_rows(self, self.fl_ctx, rows, self.num_rounds)
        # once, through the server's log: on the console of a simulator run, in the server's log file of a deployment
        self.info(f"FedDG leave-one-site-out report, unseen site {cfg.data.unseen_site} (best = after "
                  f"{self._best['round']} rounds; JSON: {path})\n{format_table(rows)}\n")

    def _stream(self, tag: str, value: float, step: int) -> None:
        stream_scalar(self, self.fl_ctx, tag, value, step)


def stream_scalar(component, fl_ctx, tag: str, value: float, step: int) -> None:
    """Send a scalar to TensorBoard through NVFlare's analytics (the server's TBAnalyticsReceiver)."""
    if value is None or not math.isfinite(value):
        return
    dxo = create_analytic_dxo(tag=tag, value=float(value), data_type=AnalyticsDataType.SCALAR, global_step=step)
    send_analytic_dxo(component, dxo=dxo, fl_ctx=fl_ctx)


def stream_rows(component, fl_ctx, rows, step: int) -> None:
    """The report rows of the unseen site and of the validation splits, as TensorBoard scalars."""
    for row in rows:
        if row["role"] == "unseen" or row["split"] == "val":
            for metric in ("dice", "hd95", "asd"):
                stream_scalar(component, fl_ctx, f"{row['model']}/{row['site']}/{row['split']}/"
                                                 f"{row['structure']}_{metric}", row[metric], step)


def aggregation_diagnostics(aggregated: FLModel) -> dict[str, Any]:
    """What the aggregator says about a round in its aggregate's metadata (GA's weights, gaps and step; gradient
    alignment's corrections), without NVFlare's ``nr_aggregated`` (the history names the sites) and without any
    value that is not JSON-safe (:func:`feddg.jsonfile.json_safe`)."""
    return json_safe({k: v for k, v in (aggregated.meta or {}).items() if k != NR_AGGREGATED})


def cast_like(value, reference):
    """Cast an aggregated array back to the global model's dtype (averaging turns integer buffers such as
    BatchNorm's ``num_batches_tracked`` into floats)."""
    dtype = getattr(reference, "dtype", None)
    return value.astype(dtype) if dtype is not None and getattr(value, "dtype", dtype) != dtype else value
