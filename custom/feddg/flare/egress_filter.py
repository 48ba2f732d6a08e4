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
``amplitude_spectra``   the ELCFS amplitude-window payload, windows of at most ``max_half_width`` and at most
                        ``max_amplitude_images`` images (:func:`feddg.flare.payloads.check_amplitude_payload`)
``amplitude_bank``      nothing (an acknowledgement)
``mla_features``        the MLA feature matrix, at most ``max_feature_width`` values per image and
                        ``max_feature_rows`` images (:func:`feddg.flare.payloads.check_feature_payload`)
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

import json

import numpy as np
from nvflare.apis.dxo import DXO

from feddg.config import FedDGConfig
from feddg.flare.constants import CONFIG_FILE, FedDGTask
from feddg.flare.payload_filter import Check, PayloadFilter
from feddg.flare.elcfs.payloads import DEFAULT_MAX_HALF_WIDTH, check_amplitude_payload
from feddg.flare.mla.payloads import DEFAULT_MAX_FEATURE_WIDTH, check_feature_payload, check_mla_evaluate_result
from feddg.flare.payloads import (
    DEFAULT_MAX_PARAMETERS,
    PayloadRejected,
    check_evaluate_result,
    check_site_info_result,
    check_train_result,
)


class SiteEgressFilter(PayloadFilter):
    """Every outgoing task result must follow its task's payload contract (see the module docstring).

    Args:
        config_file: the job's experiment file, relative to the app's config folder (to know the network's keys
            and shapes).
        max_parameters: the most values a model update may carry.
        max_half_width: the largest amplitude window half-width the site lets out (ELCFS).
        max_amplitude_images: the most images whose amplitude windows may leave (None: no cap).
        max_feature_width: the most feature values per image the MLA task may send.
        max_feature_rows: the most feature vectors the MLA task may send (None: no cap).
    """

    log_prefix = "site policy: "

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        max_parameters: int = DEFAULT_MAX_PARAMETERS,
        max_half_width: int = DEFAULT_MAX_HALF_WIDTH,
        max_amplitude_images: int | None = None,
        max_feature_width: int = DEFAULT_MAX_FEATURE_WIDTH,
        max_feature_rows: int | None = None,
    ):
        super().__init__(config_file)
        self.max_parameters = max_parameters
        self.max_half_width = max_half_width
        self.max_amplitude_images = max_amplitude_images
        self.max_feature_width = max_feature_width
        self.max_feature_rows = max_feature_rows
        self._networks: dict[str, dict[str, np.ndarray]] = {}
        self._contracts: dict[str, Check] = {
            FedDGTask.TRAIN: lambda dxo, cfg: check_train_result(dxo, self._network(cfg), self.max_parameters),
            FedDGTask.EVALUATE: lambda dxo, cfg: check_evaluate_result(dxo),
            FedDGTask.SITE_INFO: lambda dxo, cfg: check_site_info_result(dxo),
            FedDGTask.AMPLITUDE_SPECTRA: self._amplitude_windows,
            FedDGTask.MLA_FEATURES: self._feature_matrix,
            FedDGTask.MLA_EVALUATE: lambda dxo, cfg: check_mla_evaluate_result(dxo),
        }

    def check_for(self, task: str, outgoing: bool) -> Check | None:
        if not outgoing:
            return None  # this filter guards what leaves the site
        return self._contracts.get(task, _nothing_may_leave(task))

    def _amplitude_windows(self, dxo: DXO | None, cfg: FedDGConfig) -> None:
        check_amplitude_payload(dxo, None, self.max_half_width, self.max_amplitude_images)

    def _feature_matrix(self, dxo: DXO | None, cfg: FedDGConfig) -> None:
        check_feature_payload(dxo, None, self.max_feature_width, self.max_feature_rows)

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
