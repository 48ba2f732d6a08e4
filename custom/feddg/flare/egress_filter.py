"""The hospital's egress guard: one site filter on every task result, whatever the job asks.

Installed by the site in ``local/privacy.json`` as the default scope's task-result filter
(:func:`feddg.flare.site_policy.client_privacy`), it checks each outgoing result against the payload kinds this
project knows and blocks everything else, raising ContentBlockedException after a log line that names the task and
the reason (never the values):

======================  =====================================================================================
task                    what may leave
======================  =====================================================================================
``train``               DXO WEIGHTS or WEIGHT_DIFF with exactly the keys and shapes of the job's network (built
                        from the job's ``feddg.yaml``), finite, at most ``max_parameters`` values; meta: scalars
                        under the project's keys (sample count, validation Dice/loss, training loss, GA gap,
                        step count, MLA opt-in flag)
``evaluate``            DXO METRICS: nested summaries of scalars (no arrays, bounded size)
``site_info``           DXO METRICS: the package version and the preprocessing hash (two short strings)
``amplitude_spectra``   the ELCFS amplitude-window payload
                        (:func:`feddg.flare.payloads.check_amplitude_payload`, the same check as
                        :class:`~feddg.flare.amplitude_filter.AmplitudeWindowFilter`)
``amplitude_bank``      nothing (an acknowledgement)
``mla_features``        the MLA feature matrix (the same check as the MLA feature filter)
``mla_evaluate``        DXO METRICS, with the attention weights as a short list of scalars in the meta
any other task          nothing
======================  =====================================================================================

An error reply (no DXO) always passes: it carries nothing. The envelope check
(:func:`feddg.flare.payloads.check_envelope`) applies to every result: no keys outside the DXO and its headers,
no arrays in the headers.

NVFlare 2.9 runs the site's filters before the job's own on outgoing results, so the job's filters see only
what this check let out, and a job without custom code can only build filters from the site's class allow-list:
the ``feddg`` package (whose filters only block) and the NVFlare classes the jobs use, none of them a filter
(:func:`feddg.flare.site_policy.class_allow_list`). Jobs with custom code are refused by the hospitals'
authorization policy (``byoc`` denied), so no job can undo this check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, MetaKey
from nvflare.apis.filter import ContentBlockedException, Filter
from nvflare.apis.fl_constant import FilterKey, FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable

from feddg.flare.constants import CONFIG_FILE, FedDGMeta, FedDGTask
from feddg.flare.payloads import PayloadRejected, check_amplitude_payload, check_envelope

# Scalars a training result may carry in its metadata.
TRAIN_META = {FedDGMeta.NUM_TRAIN_SAMPLES, FedDGMeta.VAL_DICE, FedDGMeta.VAL_LOSS, FedDGMeta.TRAIN_LOSS,
              FedDGMeta.GENERALIZATION_GAP, MetaKey.NUM_STEPS_CURRENT_ROUND, "share_local_model"}
EVALUATE_META = {FedDGMeta.MODEL_NAME, FedDGMeta.ROUND}
MLA_FEATURES_TASK = "mla_features"
MLA_EVALUATE_TASK = "mla_evaluate"
_ALWAYS_ALLOWED_META = {MetaKey.FILTER_HISTORY}


def _is_scalar(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, (int, np.integer)):
        return True
    if isinstance(value, (float, np.floating)):
        return True
    return isinstance(value, str) and len(value) <= 256


def check_scalar_meta(dxo: DXO, allowed: set[str], max_list: int = 0) -> None:
    """Meta keys are among ``allowed`` and hold scalars (or, with ``max_list``, short lists / maps of scalars)."""
    for key, value in (dxo.meta or {}).items():
        if key in _ALWAYS_ALLOWED_META:
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


def check_weights_payload(dxo: DXO, reference: Mapping[str, tuple[int, ...]], max_parameters: int) -> None:
    """Model weights or weight differences with exactly the reference keys and shapes, finite floats."""
    if dxo.data_kind not in (DataKind.WEIGHTS, DataKind.WEIGHT_DIFF):
        raise PayloadRejected(f"expected model weights or weight differences, got {dxo.data_kind}")
    data = dxo.data
    if not isinstance(data, dict):
        raise PayloadRejected("the weights are not a mapping")
    missing, extra = sorted(set(reference) - set(data)), sorted(set(data) - set(reference))
    if missing or extra:
        raise PayloadRejected(f"parameter names differ from the job's network (missing {missing[:3]}, "
                              f"unexpected {extra[:3]})")
    total = 0
    for name, shape in reference.items():
        value = data[name]
        if not isinstance(value, np.ndarray):
            raise PayloadRejected(f"parameter {name!r} is not an array")
        if value.shape != tuple(shape):
            raise PayloadRejected(f"parameter {name!r} has shape {value.shape}, the network has {tuple(shape)}")
        if value.dtype.kind not in "fiu":
            raise PayloadRejected(f"parameter {name!r} has dtype {value.dtype}")
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise PayloadRejected(f"parameter {name!r} holds NaN or infinite values")
        total += value.size
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


class SiteEgressFilter(Filter):
    """Every outgoing task result must be one of the payload kinds this project knows (see the module docstring).

    Args:
        config_file: the job's experiment file, relative to the app's config folder (to know the network's keys
            and shapes).
        max_parameters: the most values a model update may carry.
        max_half_width: the largest amplitude window half-width the site lets out (ELCFS).
        max_amplitude_images: the most images whose amplitude windows may leave (None: no cap).
        max_feature_rows: the most feature vectors the MLA task may send (None: no cap).
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        max_parameters: int = 50_000_000,
        max_half_width: int = 8,
        max_amplitude_images: int | None = None,
        max_feature_rows: int | None = None,
    ):
        super().__init__()
        self.config_file = config_file
        self.max_parameters = max_parameters
        self.max_half_width = max_half_width
        self.max_amplitude_images = max_amplitude_images
        self.max_feature_rows = max_feature_rows
        self._reference: dict[str, dict[str, tuple[int, ...]]] = {}

    def process(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        if fl_ctx.get_prop(FLContextKey.FILTER_DIRECTION) == FilterKey.IN:
            return shareable  # this filter guards what leaves the site
        task = fl_ctx.get_prop(FLContextKey.TASK_NAME)
        try:
            dxo = check_envelope(shareable)
            if dxo is not None:
                self._check(task, dxo, fl_ctx)
        except PayloadRejected as e:
            self.log_error(fl_ctx, f"site policy: task {task}: blocked the result leaving the site: {e}")
            raise ContentBlockedException(f"site policy: task {task}: {e}") from e
        return shareable

    def _check(self, task: str, dxo: DXO, fl_ctx: FLContext) -> None:
        if task == FedDGTask.TRAIN:
            check_weights_payload(dxo, self._network(fl_ctx), self.max_parameters)
            check_scalar_meta(dxo, TRAIN_META)
        elif task == FedDGTask.EVALUATE:
            check_metrics_payload(dxo)
            check_scalar_meta(dxo, EVALUATE_META)
        elif task == FedDGTask.SITE_INFO:
            check_metrics_payload(dxo, max_values=2)
            check_scalar_meta(dxo, set())
        elif task == FedDGTask.AMPLITUDE_SPECTRA:
            check_amplitude_payload(dxo, None, self.max_half_width, self.max_amplitude_images)
        elif task == MLA_FEATURES_TASK:
            from feddg.flare.payloads import check_feature_payload

            check_feature_payload(dxo, max_rows=self.max_feature_rows)
        elif task == MLA_EVALUATE_TASK:
            check_metrics_payload(dxo)
            check_scalar_meta(dxo, EVALUATE_META | {"attention_weights", "attention_sites"}, max_list=64)
        else:
            raise PayloadRejected(f"results of task {task!r} may carry nothing, got a {dxo.data_kind} payload")

    def _network(self, fl_ctx: FLContext) -> dict[str, tuple[int, ...]]:
        job = fl_ctx.get_job_id() or ""
        if job not in self._reference:
            from feddg.config import ConfigError
            from feddg.flare.job_config import load_job_config
            from feddg.nets.unet import build_model

            try:
                cfg = load_job_config(fl_ctx, self.config_file)
            except ConfigError as e:
                raise PayloadRejected(f"the job's network is unknown ({e})") from e
            self._reference[job] = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
        return self._reference[job]
