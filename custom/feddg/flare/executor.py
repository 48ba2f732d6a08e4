"""The site's Executor: local training and evaluation on the site's own data.

Tasks (names configurable, defaults in :class:`feddg.flare.constants.FedDGTask`):
  * ``train``: in, the global weights (DXO WEIGHTS). The site scores the received model on its validation
    split, trains ``train.local_epochs`` epochs, and sends back its weights (DXO WEIGHTS) with metadata
    ``num_train_samples`` (N_k), ``val_dice``/``val_loss`` of the received model, ``train_loss`` and NVFlare's
    ``NUM_STEPS_CURRENT_ROUND``, and what the job's site hooks add (:mod:`feddg.flare.site_hooks`; GA: the
    ``generalization_gap``). The unseen site refuses this task.
  * ``evaluate``: in, a model's weights. Out, DXO METRICS: {split: summary} for every non-empty split the
    site has ("val" and the in-domain "test" at a training site, "test" at the unseen site).

Every result of a task that names its run (``feddg_run_id``: the rounds' workflow sends it on ``site_info``,
``train`` and ``evaluate``) names the run this site process serves: the first run a task named. A task of another
run (another simulator's server on the same host, reached under this site's name) is answered with this process's
own run, and that server leaves the answer out (:mod:`feddg.flare.controller`).

Nothing but weights, scalars and metric summaries leaves the site.

State kept between rounds (optimizer moments, last local loss) lives in the site's run folder, not only in
memory: with ``nvflare simulator -t`` smaller than the number of sites every task runs in a fresh process.
"""

from __future__ import annotations

import copy
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from nvflare.apis.dxo import DXO, DataKind, MetaKey, from_shareable
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from feddg.compute import ThreadBudgetError, apply_thread_budget
from feddg.config import ConfigError, FedDGConfig
from feddg.data.dataset import SliceSet, load_site, make_loader
from feddg.data.errors import DataError
from feddg.evaluation import evaluate_sliceset, validation_scores
from feddg.flare.constants import CONFIG_FILE, FedDGMeta, FedDGTask
from feddg.flare.job_config import load_job_config
from feddg.flare.payloads import run_of, with_case_scores, with_run
from feddg.flare.redact import public, scrub
from feddg.flare.site_config import SiteConfigError, load_site_config, site_config_path, site_data
from feddg.flare.site_hooks import TrainingContext, TrainingHook
from feddg.flare.site_info import site_fingerprint
from feddg.flare.timings import TIMINGS_FILE, append_timing, peak_rss_mib
from feddg.jsonfile import read_json, write_json
from feddg.nets.unet import build_model, select_device
from feddg.precision import Precision, PrecisionError
from feddg.seeds import round_seed
from feddg.training import LocalTrainResult, local_optimizer, train_epochs

STATE_DIR = "feddg_site_state"


class LocalTrainingError(RuntimeError):
    """The site cannot run its local training this round; the message says why."""


class BadTaskData(ValueError):
    """The task data a site received is not what the task carries; the message says why."""


@dataclass(frozen=True)
class TaskHandler:
    """How an executor answers one task.

    Attributes:
        handle: (task data, fl_ctx, abort signal) -> the result; it may raise :class:`BadTaskData` (answered with
            ``BAD_TASK_DATA``) or a ConfigError / DataError / SiteConfigError (answered with an error, named in the
            log).
        unseen_site_refuses: the held-out site answers with an error instead (it never trains or sends data).
        refusal: what the held-out site says when it refuses (after "site X is the unseen site of this job: ").
    """

    handle: Callable[[Shareable, FLContext, Signal], Shareable]
    unseen_site_refuses: bool = False
    refusal: str = "it takes no part in this task"


class FedDGExecutor(Executor):
    """Local training and evaluation for one site; the site is the NVFlare client's name.

    Args:
        config_file: the job's ``feddg.yaml``, relative to the app's config folder.
        train_task_name: name of the training task.
        evaluate_task_name: name of the evaluation task.
        tb_writer_id: optional :class:`nvflare.app_opt.tracking.tb.tb_writer.TBWriter` component that streams
            the local training loss to the server's TensorBoard.
        site_hooks: ids of the job's :class:`~feddg.flare.site_hooks.TrainingHook` components, called around each
            round's local training in this order; what they return joins the result's metadata (only the keys
            their parts declare: nothing leaves the site that the method does not use).
        send_weight_diff: send local minus received weights (DXO WEIGHT_DIFF) instead of the weights, for
            aggregators that work on updates (gradient alignment); NVFlare calls this a DIFF transfer.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        train_task_name: str = FedDGTask.TRAIN,
        evaluate_task_name: str = FedDGTask.EVALUATE,
        tb_writer_id: str | None = None,
        site_hooks: list[str] | None = None,
        send_weight_diff: bool = False,
    ):
        super().__init__()
        self.config_file = config_file
        self.train_task_name = train_task_name
        self.evaluate_task_name = evaluate_task_name
        self.tb_writer_id = tb_writer_id
        self.site_hooks = site_hooks  # as given: a job export reads every argument back from self.<arg>
        self._hooks: list[tuple[str, TrainingHook, frozenset[str]]] = []
        self.send_weight_diff = send_weight_diff
        self._cfg: FedDGConfig | None = None
        self._data: dict[str, SliceSet] | None = None
        self._site: str | None = None
        self._received, self._setup_s = 0.0, 0.0  # when the current task arrived; its data loading, s
        self._run: str | None = None  # the run this process serves: the first a task named (FedDGMeta.RUN_ID)
        # task name -> handler; a method's executor adds its own tasks (site_info is answered before any setup)
        self.handlers: dict[str, TaskHandler] = {
            train_task_name: TaskHandler(self._train_task, unseen_site_refuses=True, refusal="it never trains"),
            evaluate_task_name: TaskHandler(self._evaluate_task),
        }

    # ------------------------------------------------------------------ entry point
    def log_error(self, fl_ctx: FLContext, msg: str, fire_event: bool = True) -> None:
        """ERROR lines reach the server (NVFlare streams a job's error log there): they are logged without paths or
        data-file names (:mod:`feddg.flare.redact`); the full line stays in the site's local log at INFO."""
        public_msg = scrub(msg)
        if public_msg != msg:
            super().log_info(fl_ctx, f"(local detail of the next error) {msg}")
        super().log_error(fl_ctx, public_msg, fire_event)

    def execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        try:
            named = self._serve(shareable, fl_ctx)
            reply = self._execute(task_name, shareable, fl_ctx, abort_signal)
            return with_run(reply, self._run) if named else reply
        except Exception as e:  # noqa: BLE001 - the site answers with an error, NVFlare logs no traceback with paths
            super().log_info(fl_ctx, f"(local detail) task {task_name} failed:\n{traceback.format_exc()}")
            self.log_error(fl_ctx, f"task {task_name} failed at site {fl_ctx.get_identity_name()}: {public(e)}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)

    def _serve(self, shareable: Shareable, fl_ctx: FLContext) -> bool:
        """Whether the task names its run; the first run named is the one this process serves from then on. A task
        of another run is logged: its server will leave this process's answer out."""
        run = run_of(shareable)
        if run is None:
            return False
        if self._run is None:
            self._run = run
        elif run != self._run:
            self.log_error(fl_ctx, f"site {fl_ctx.get_identity_name()}: this process serves run {self._run}, but a "
                                   f"task of run {run} reached it (another run's server on this host); the answer "
                                   f"names run {self._run}, and that server leaves it out")
        return True

    def _execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        if task_name == FedDGTask.SITE_INFO:
            return self._site_info(fl_ctx)
        handler = self.handlers.get(task_name)
        if handler is None:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        self._received, setup_started = time.time(), time.perf_counter()
        try:
            self._setup(fl_ctx)
            self._setup_s = time.perf_counter() - setup_started
        except (ConfigError, DataError, SiteConfigError, ThreadBudgetError, PrecisionError) as e:
            # Named before any training: the site answers with an error, the others go on.
            self.log_error(fl_ctx, f"site {fl_ctx.get_identity_name()} cannot start: {e}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        if handler.unseen_site_refuses and self._cfg.data.role(self._site) == "unseen":
            self.log_error(fl_ctx, f"site {self._site} is the unseen site of this job: {handler.refusal}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        if abort_signal.triggered:
            return make_reply(ReturnCode.TASK_ABORTED)
        try:
            return handler.handle(shareable, fl_ctx, abort_signal)
        except BadTaskData as e:
            self.log_error(fl_ctx, f"site {self._site}, task {task_name}: {e}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        except (ConfigError, DataError, SiteConfigError) as e:
            self.log_error(fl_ctx, f"site {self._site}, task {task_name}: {e}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)

    @staticmethod
    def task_dxo(shareable: Shareable) -> DXO:
        """The DXO of a task's data; BadTaskData when there is none."""
        try:
            return from_shareable(shareable)
        except ValueError as e:
            raise BadTaskData(f"malformed task data: {e}") from None

    def _received_model(self, shareable: Shareable) -> tuple[torch.nn.Module, DXO]:
        """The network of the job with the weights the task carries; BadTaskData when they do not fit."""
        dxo = self.task_dxo(shareable)
        if dxo.data_kind != DataKind.WEIGHTS or not isinstance(dxo.data, dict) or not dxo.data:
            raise BadTaskData(f"expected model weights, got {dxo.data_kind}")
        try:
            return self._load_weights(dxo.data), dxo
        except (RuntimeError, KeyError, ValueError) as e:
            raise BadTaskData(f"the received weights do not fit the configured network: {e}") from None

    def _train_task(self, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        model, _ = self._received_model(shareable)
        return self._train(model, shareable, fl_ctx, abort_signal)

    def _evaluate_task(self, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        model, dxo = self._received_model(shareable)
        return self._evaluate(model, dxo, fl_ctx)

    def _site_info(self, fl_ctx: FLContext) -> Shareable:
        """The site's ``feddg`` version and preprocessing hash (:mod:`feddg.flare.site_info`): two short strings."""
        cfg = self._cfg or load_job_config(fl_ctx, self.config_file)
        return DXO(data_kind=DataKind.METRICS, data=site_fingerprint(cfg)).to_shareable()

    # ------------------------------------------------------------------ setup
    def _setup(self, fl_ctx: FLContext) -> None:
        if self._data is not None:
            return
        self._site = fl_ctx.get_identity_name()
        self._cfg = load_job_config(fl_ctx, self.config_file)
        self._hooks = self._resolve_hooks(fl_ctx)
        if self._site not in self._cfg.data.sites:
            raise ConfigError(f"client name {self._site!r} is not one of data.sites {self._cfg.data.sites}")
        site_cfg = load_site_config(fl_ctx)
        budget = apply_thread_budget(site_cfg.num_threads)
        self._device = select_device()
        self._precision = Precision(self._cfg.train.amp, self._device)
        self._data = load_site(site_data(self._cfg.data, site_cfg, site_config_path(fl_ctx)), self._site)
        if self._site != self._cfg.data.unseen_site and len(self._data["train"]) == 0:
            raise DataError("no training images after preprocessing", site=self._site)
        sizes = {k: len(v) for k, v in self._data.items()}
        self.log_info(fl_ctx, f"site {self._site}: {sizes} images on {self._device} "
                              f"({self._precision.describe()}), {budget.describe()}")

    def _resolve_hooks(self, fl_ctx: FLContext) -> list[tuple[str, TrainingHook, frozenset[str]]]:
        """The job's site hooks with the metadata keys each may add; ConfigError naming a missing or wrong one."""
        from feddg.flare.registry import hook_sends

        hooks = []
        for hook_id in self.site_hooks or []:
            hook = fl_ctx.get_engine().get_component(hook_id)
            if not isinstance(hook, TrainingHook):
                raise ConfigError(f"site_hooks: {hook_id!r} is not a TrainingHook component of this job "
                                  f"(got {type(hook).__name__})")
            hooks.append((hook_id, hook, frozenset(hook_sends(type(hook)))))
        return hooks

    def _call_hooks(self, stage: str, ctx: TrainingContext, model: torch.nn.Module,
                    states: dict[str, dict[str, Any]]) -> dict[str, float]:
        """Every hook's ``stage`` ("before_training" / "after_training") with its own state; the metadata they add.
        LocalTrainingError when a hook returns a key its part does not declare (it would leave the site)."""
        meta: dict[str, float] = {}
        for hook_id, hook, sends in self._hooks:
            ctx.state = states.setdefault(hook_id, {})
            added = getattr(hook, stage)(ctx, model)
            undeclared = sorted(set(added) - sends)
            if undeclared:
                raise LocalTrainingError(f"site hook {hook_id!r} returned {undeclared}, which its part does not "
                                         f"declare (declared: {sorted(sends)})")
            meta.update(added)
        return meta

    def _load_weights(self, weights: dict[str, Any]) -> torch.nn.Module:
        model = build_model(self._cfg)
        state = {k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()}
        model.load_state_dict(state, strict=True)
        return model.to(self._device)

    # ------------------------------------------------------------------ train
    def _train(self, model: torch.nn.Module, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        cfg, site = self._cfg, self._site
        current_round = int(shareable.get_header("current_round", 0) or 0)
        meta: dict[str, Any] = {FedDGMeta.NUM_TRAIN_SAMPLES: len(self._data["train"])}
        validation_started = time.perf_counter()
        if len(self._data["val"]):
            scores = validation_scores(model, self._data["val"], cfg.data.label_names, self._device,
                                       cfg.eval.batch_size)
            meta[FedDGMeta.VAL_DICE], meta[FedDGMeta.VAL_LOSS] = scores["dice"], scores["loss"]
        state_dir = self._state_dir(fl_ctx)
        hook_states = read_json(os.path.join(state_dir, "state.json")).get("hooks", {})
        received_scores = {k: meta[k] for k in (FedDGMeta.VAL_DICE, FedDGMeta.VAL_LOSS) if k in meta}
        ctx = TrainingContext(site, current_round, cfg, self._data, self._device, received_scores)
        try:
            meta.update(self._call_hooks("before_training", ctx, model, hook_states))
        except LocalTrainingError as e:
            self.log_error(fl_ctx, f"site {site}, round {current_round}: {e}; no update is sent")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        validation_s = time.perf_counter() - validation_started
        seed = round_seed(cfg.train.seed, site, current_round)
        torch.manual_seed(seed)
        loader = make_loader(self._data["train"], cfg.train.batch_size, shuffle=True,
                             augment=cfg.train.augment, seed=seed, device=self._device)
        optimizer = local_optimizer(model.parameters(), cfg.train.lr)
        self._restore_optimizer(optimizer, state_dir, fl_ctx)
        received = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        global_model = copy.deepcopy(model).eval() if cfg.train.fedprox_mu > 0 else None
        training_started = time.perf_counter()
        try:
            result = self._local_train(model, loader, optimizer, global_model, seed, fl_ctx)
        except FloatingPointError as e:
            self.log_error(fl_ctx, f"site {site}, round {current_round}: local training diverged ({e}); "
                                   f"no update is sent")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        except LocalTrainingError as e:
            self.log_error(fl_ctx, f"site {site}, round {current_round}: cannot train: {e}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        training_s = time.perf_counter() - training_started
        if abort_signal.triggered:
            return make_reply(ReturnCode.TASK_ABORTED)
        torch.save(optimizer.state_dict(), os.path.join(state_dir, "optimizer.pt"))
        validation_started = time.perf_counter()  # the hooks' time counts as validation (they score models)
        try:
            meta.update(self._call_hooks("after_training", ctx, model, hook_states))
        except LocalTrainingError as e:
            self.log_error(fl_ctx, f"site {site}, round {current_round}: {e}; no update is sent")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        validation_s += time.perf_counter() - validation_started
        write_json(os.path.join(state_dir, "state.json"), {"round": current_round, "train_loss": result.mean_loss,
                                                           "steps": result.steps, "hooks": hook_states})
        meta[FedDGMeta.TRAIN_LOSS] = result.mean_loss
        meta[MetaKey.NUM_STEPS_CURRENT_ROUND] = result.steps
        meta.update(self._extra_train_meta(fl_ctx))
        self._stream(fl_ctx, "train_loss", result.mean_loss, current_round)
        for tag, value in result.extra.items():
            self._stream(fl_ctx, tag, value, current_round)
        self.log_info(fl_ctx, f"site {site}, round {current_round}: val Dice of the received model "
                              f"{meta.get(FedDGMeta.VAL_DICE, float('nan')):.4f}, train loss {result.mean_loss:.4f}")
        weights = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        if self.send_weight_diff:
            weights = {k: weights[k] - received[k] for k in weights}
        reply = DXO(data_kind=DataKind.WEIGHT_DIFF if self.send_weight_diff else DataKind.WEIGHTS, data=weights,
                    meta=meta).to_shareable()
        append_timing(os.path.join(state_dir, TIMINGS_FILE), {
            "task": self.train_task_name, "round": current_round, "received": self._received,
            "returned": time.time(), "setup_s": self._setup_s, "validation_s": validation_s,
            "training_s": training_s, "data_s": loader.seconds, "steps": result.steps,
            "peak_rss_mib": peak_rss_mib()})
        return reply

    def _local_train(self, model: torch.nn.Module, loader, optimizer: torch.optim.Optimizer,
                     global_model: torch.nn.Module | None, seed: int, fl_ctx: FLContext) -> LocalTrainResult:
        """The method's local training (FedAvg / FedProx here); methods with their own local step override it.

        Raises:
            FloatingPointError: the loss diverged. LocalTrainingError: the site cannot train (a reason is given).
        """
        t = self._cfg.train
        return train_epochs(model, loader, optimizer, t.local_epochs, self._device, t.fedprox_mu, global_model,
                            t.local_steps, self._precision)

    def _extra_train_meta(self, fl_ctx: FLContext) -> dict[str, Any]:
        """Metadata a method adds to the training result (none here)."""
        return {}

    def _state_dir(self, fl_ctx: FLContext) -> str:
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        path = os.path.join(run_dir, STATE_DIR)
        os.makedirs(path, exist_ok=True)
        return path

    def _restore_optimizer(self, optimizer: torch.optim.Optimizer, state_dir: str, fl_ctx: FLContext) -> None:
        path = os.path.join(state_dir, "optimizer.pt")
        if not os.path.exists(path):
            return
        try:
            optimizer.load_state_dict(torch.load(path, map_location=self._device, weights_only=True))
        except (RuntimeError, ValueError, KeyError) as e:
            self.log_warning(fl_ctx, f"site {self._site}: stored optimizer state unusable ({e}); starting afresh")

    # ------------------------------------------------------------------ evaluate
    def _evaluate(self, model: torch.nn.Module, dxo: DXO, fl_ctx: FLContext) -> Shareable:
        cfg = self._cfg
        share_cases = load_site_config(fl_ctx).share_case_scores
        metrics = {}
        for split in ("val", "test"):
            if len(self._data[split]):
                result = evaluate_sliceset(model, self._data[split], cfg.data.label_names, self._device,
                                           cfg.eval.batch_size, cfg.eval.largest_component)
                metrics[split] = with_case_scores(result, cfg.data.label_names, share_cases)
        if not metrics:
            self.log_error(fl_ctx, f"site {self._site}: no validation or test images to evaluate on")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        name = dxo.get_meta_prop(FedDGMeta.MODEL_NAME, "model")
        self.log_info(fl_ctx, f"site {self._site}: evaluated the {name} model on {sorted(metrics)}")
        return DXO(data_kind=DataKind.METRICS, data=metrics, meta={FedDGMeta.MODEL_NAME: name}).to_shareable()

    def _stream(self, fl_ctx: FLContext, tag: str, value: float, step: int) -> None:
        if not self.tb_writer_id or not math.isfinite(value):
            return
        writer = fl_ctx.get_engine().get_component(self.tb_writer_id)
        if writer is not None:
            writer.add_scalar(tag, value, global_step=step)
