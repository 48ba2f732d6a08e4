"""The site's guard on MLA's feature bank: an NVFlare Filter.

On the way out (task result chain) it lets the ``mla_features`` result leave only if it is exactly the feature
payload of :mod:`feddg.flare.payloads`: one float32 matrix (images x features), finite, of the declared width (at
most ``max_width`` values per image, so that no row can carry an image), at most ``max_rows`` images, nothing else
in the DXO, its meta or the Shareable. Raw images, extra keys, NaN/Inf, a wrong width or too many rows are blocked:
the filter logs the task and the reason and raises :class:`~nvflare.apis.filter.ContentBlockedException`, so NVFlare
sends the server an error reply instead.

Every other task, and task data coming in, passes untouched, so the filter can sit in a job's filter list for the
``mla_features`` task or in a site's ``privacy.json`` scope, where it sees every task (NVFlare runs site filters
before the job's own). Example scope::

    {"name": "feddg", "task_result_filters": [{"path": "feddg.flare.feature_filter.FeatureMatrixFilter",
                                               "args": {"max_rows": 200, "max_width": 256}}]}
"""

from __future__ import annotations

from nvflare.apis.filter import ContentBlockedException, Filter
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable

from feddg.flare.amplitude_filter import filters_outgoing
from feddg.flare.constants import FedDGTask
from feddg.flare.payloads import PayloadRejected, check_envelope, check_feature_payload

DEFAULT_MAX_WIDTH = 512  # the jobs send 128 values per image (a 32 x 32 image would need 1024)


class FeatureMatrixFilter(Filter):
    """Blocks everything on the feature task's result except the declared feature matrix.

    Args:
        task_name: the task whose result carries the site's feature vectors.
        width: the job's exact feature width; None (a site policy) accepts any width up to ``max_width``.
        max_width: the most values per image the site lets out.
        max_rows: the most images whose features may leave the site; None: no cap.
    """

    def __init__(
        self,
        task_name: str = FedDGTask.MLA_FEATURES,
        width: int | None = None,
        max_width: int = DEFAULT_MAX_WIDTH,
        max_rows: int | None = None,
    ):
        super().__init__()
        for name, value in (("width", width), ("max_width", max_width), ("max_rows", max_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if width is not None and max_width is not None and width > max_width:
            raise ValueError(f"width {width} exceeds max_width {max_width}")
        self.task_name = task_name
        self.width = width
        self.max_width = max_width
        self.max_rows = max_rows

    def process(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        task = fl_ctx.get_prop(FLContextKey.TASK_NAME)
        if task != self.task_name or not filters_outgoing(self, fl_ctx):
            return shareable
        try:
            dxo = check_envelope(shareable)
            if dxo is not None:  # an error reply carries nothing and may pass
                x = check_feature_payload(dxo, self.width, self.max_width, self.max_rows)
                self.log_info(fl_ctx, f"task {task}: letting out the feature vectors of {x.shape[0]} images "
                                      f"({x.shape[1]} values each)")
        except PayloadRejected as e:
            self.log_error(fl_ctx, f"task {task}: blocked the result leaving the site: {e}")
            raise ContentBlockedException(f"task {task}: {e}") from e
        return shareable
