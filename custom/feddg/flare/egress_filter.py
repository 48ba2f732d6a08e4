"""The hospital's egress guard: one site filter on every task result, whatever the job asks.

Installed by the site in ``local/privacy.json`` as the default scope's task-result filter
(:func:`feddg.flare.site_policy.client_privacy`), it checks each outgoing result against the payload contract of its
task (:mod:`feddg.flare.payloads`, the same checks the executors' payload builders and the job filters follow) and
blocks everything else, raising ContentBlockedException after a log line that names the task and the reason (never
the values):

======================  =====================================================================================
task                    what may leave
======================  =====================================================================================
``train``               DXO WEIGHTS or WEIGHT_DIFF with exactly the keys and shapes of the job's network (built
                        from the job's ``feddg.yaml``), finite, at most ``max_parameters`` values; meta: scalars
                        under the project's keys (sample count, validation Dice/loss, training loss, GA gap,
                        step count, MLA opt-in flag)
``evaluate``            DXO METRICS: nested summaries of scalars (no arrays, bounded size)
``site_info``           DXO METRICS: the package version and the preprocessing hash (two short strings)
a method's own task    what the method's part declares (``egress`` in :mod:`feddg.flare.registry`): for ELCFS's
                        ``amplitude_spectra`` the amplitude-window payload within ``max_half_width`` and
                        ``max_amplitude_images``; for MLA's ``mla_features`` the feature matrix within
                        ``max_feature_width`` and ``max_feature_rows``, for ``mla_evaluate`` metric summaries with
                        the attention weights
any other task          nothing (ELCFS's ``amplitude_bank`` is acknowledged with an empty reply)
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

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO

from feddg.config import FedDGConfig
from feddg.flare import registry
from feddg.flare.constants import CONFIG_FILE, FedDGTask
from feddg.flare.payload_filter import Check, PayloadFilter
from feddg.flare.payloads import (
    PayloadRejected,
    check_evaluate_result,
    check_site_info_result,
    check_train_result,
)
from feddg.flare.site_limits import MAX_PARAMETERS, egress_limits


class SiteEgressFilter(PayloadFilter):
    """Every outgoing task result must follow its task's payload contract (see the module docstring).

    Args:
        config_file: the job's experiment file, relative to the app's config folder (to know the network's keys
            and shapes).
        limits: the site's limits by name (:func:`feddg.flare.site_limits.all_site_limits`: ``max_parameters``, the
            most values a model update may carry, and each method's, e.g. ``max_half_width`` and
            ``max_amplitude_images`` for ELCFS, ``max_feature_width`` and ``max_feature_rows`` for MLA); a limit not
            given keeps its default.
    """

    log_prefix = "site policy: "

    def __init__(self, config_file: str = CONFIG_FILE, **limits: int | None):
        super().__init__(config_file)
        self.limits = egress_limits(**limits)
        self._networks: dict[str, dict[str, np.ndarray]] = {}
        train_meta = registry.train_meta()
        self._contracts: dict[str, Check] = {
            FedDGTask.TRAIN: lambda dxo, cfg: check_train_result(dxo, self._network(cfg),
                                                                 self.limits[MAX_PARAMETERS.name], train_meta),
            FedDGTask.EVALUATE: lambda dxo, cfg: check_evaluate_result(dxo),
            FedDGTask.SITE_INFO: lambda dxo, cfg: check_site_info_result(dxo),
            **{task: self._bound(check) for task, check in registry.egress_checks().items()},
        }

    def check_for(self, task: str, outgoing: bool) -> Check | None:
        if not outgoing:
            return None  # this filter guards what leaves the site
        return self._contracts.get(task, _nothing_may_leave(task))

    def _bound(self, check: Any) -> Check:
        """A method's egress check with this site's limits."""
        limits: Mapping[str, Any] = self.limits
        return lambda dxo, cfg: check(dxo, cfg, limits)

    def _network(self, cfg: FedDGConfig) -> dict[str, np.ndarray]:
        """The job's network as the reference an update must fit (built once per network)."""
        from feddg.nets.unet import build_model

        key = json.dumps([cfg.data.task, cfg.model.model_dump()])
        if key not in self._networks:
            self._networks[key] = {k: v.numpy() for k, v in build_model(cfg).state_dict().items()}
        return self._networks[key]


def _nothing_may_leave(task: str) -> Check:
    def check(dxo: DXO | None, cfg: FedDGConfig) -> None:
        raise PayloadRejected(f"results of task {task!r} may carry nothing, got a {dxo.data_kind} payload")

    return check
