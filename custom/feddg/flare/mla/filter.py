"""The site's guard on MLA's feature bank: an NVFlare Filter.

On the way out (task result chain) it lets the ``mla_features`` result leave only if it is exactly the feature
payload of :mod:`feddg.flare.payloads`: one float32 matrix (images x features), finite, of the width the job's
``feddg.yaml`` implies (:func:`feddg.flare.mla.settings.mla_feature_width`, read at run time), at most ``max_width`` values per
image (so that no row can carry an image), at most ``mla.feature_images`` (and ``max_rows``) images, nothing else
in the DXO, its meta or the Shareable. Raw images, extra keys, NaN/Inf, a wrong width or too many rows are blocked:
the filter logs the task and the reason and raises :class:`~nvflare.apis.filter.ContentBlockedException`, so NVFlare
sends the server an error reply instead.

Every other task, and task data coming in, passes untouched, so the filter can sit in a job's filter list for the
``mla_features`` task or in a site's ``privacy.json`` scope, where it sees every task (NVFlare runs site filters
before the job's own); there its arguments are the site's own caps, e.g. ``{"max_rows": 200, "max_width": 256}``.
"""

from __future__ import annotations

from nvflare.apis.dxo import DXO

from feddg.config import FedDGConfig
from feddg.flare.mla.settings import mla_feature_width
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.mla.payloads import DEFAULT_MAX_FEATURE_WIDTH, MLATask, check_feature_payload
from feddg.flare.payload_filter import Check, PayloadFilter
from feddg.flare.payloads import smallest_cap


class FeatureMatrixFilter(PayloadFilter):
    """Blocks everything on the feature task's result except the job's feature matrix.

    Args:
        config_file: the job's ``feddg.yaml`` (the ``mla`` section: encoder, its widths, ``feature_images``).
        task_name: the task whose result carries the site's feature vectors.
        max_width: the most values per image the site lets out, whatever the job says.
        max_rows: the most images whose features may leave the site, whatever the job says; None: the job's cap.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        task_name: str = MLATask.MLA_FEATURES,
        max_width: int = DEFAULT_MAX_FEATURE_WIDTH,
        max_rows: int | None = None,
    ):
        super().__init__(config_file)
        for name, value in (("max_width", max_width), ("max_rows", max_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        self.task_name = task_name
        self.max_width = max_width
        self.max_rows = max_rows

    def check_for(self, task: str, outgoing: bool) -> Check | None:
        return self._check if outgoing and task == self.task_name else None

    def _check(self, dxo: DXO | None, cfg: FedDGConfig) -> str:
        x = check_feature_payload(dxo, mla_feature_width(cfg), self.max_width,
                                  smallest_cap(cfg.mla.feature_images, self.max_rows))
        return f"letting out the feature vectors of {x.shape[0]} images ({x.shape[1]} values each)"
