"""The site's guard on the ELCFS amplitude exchange: an NVFlare Filter.

On the way out (task result chain) it lets the ``amplitude_spectra`` result leave only if it is exactly the
amplitude-window payload of :mod:`feddg.flare.payloads`: the declared (2 b_h + 1) x (2 b_w + 1) window per channel,
floats, finite, non-negative, at most ``max_images`` images, nothing else in the DXO, its meta or the Shareable.
A raw image, a phase, a full spectrum or an extra key is blocked: the filter logs the task and the reason and raises
:class:`~nvflare.apis.filter.ContentBlockedException`, so NVFlare sends the server an error reply instead.

On the way in (task data chain) the same class validates the ``amplitude_bank`` a site receives.

Every other task passes untouched, so the filter can sit in a job's filter list for two tasks or in a site's
``privacy.json`` scope, where it sees every task (NVFlare runs site filters before the job's own). Example scope::

    {"name": "feddg", "task_result_filters": [{"path": "feddg.flare.amplitude_filter.AmplitudeWindowFilter",
                                               "args": {"max_images": 200, "max_half_width": 4}}],
                      "task_data_filters":   [{"path": "feddg.flare.amplitude_filter.AmplitudeWindowFilter",
                                               "args": {"max_half_width": 4}}]}
"""

from __future__ import annotations

from nvflare.apis.filter import ContentBlockedException, Filter, FilterChainType, FilterContextKey
from nvflare.apis.fl_constant import FilterKey, FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable

from feddg.flare.constants import FedDGTask
from feddg.flare.payloads import PayloadRejected, check_amplitude_bank, check_amplitude_payload, check_envelope


class AmplitudeWindowFilter(Filter):
    """Blocks everything on the amplitude tasks except the declared amplitude-window payloads.

    Args:
        exchange_task_name: the task whose result carries the site's amplitude windows.
        bank_task_name: the task whose data carries the distribution bank.
        half_widths: the job's exact window half-widths (b_h, b_w); None (a site policy) accepts any declared window
            up to ``max_half_width``.
        max_half_width: the largest window half-width the site lets out or accepts.
        max_images: the most images whose windows may leave the site; None: no cap.
    """

    def __init__(
        self,
        exchange_task_name: str = FedDGTask.AMPLITUDE_SPECTRA,
        bank_task_name: str = FedDGTask.AMPLITUDE_BANK,
        half_widths: list[int] | None = None,
        max_half_width: int = 8,
        max_images: int | None = None,
    ):
        super().__init__()
        if half_widths is not None and (len(half_widths) != 2 or min(half_widths) < 0):
            raise ValueError(f"half_widths must be two non-negative integers, got {half_widths}")
        self.exchange_task_name = exchange_task_name
        self.bank_task_name = bank_task_name
        self.half_widths = tuple(half_widths) if half_widths is not None else None
        self.max_half_width = max_half_width
        self.max_images = max_images

    def process(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        task = fl_ctx.get_prop(FLContextKey.TASK_NAME)
        outgoing = self._outgoing(fl_ctx)
        try:
            if outgoing and task == self.exchange_task_name:
                dxo = check_envelope(shareable)
                if dxo is not None:  # an error reply carries nothing and may pass
                    windows = check_amplitude_payload(dxo, self.half_widths, self.max_half_width, self.max_images)
                    self.log_info(fl_ctx, f"task {task}: letting out {windows.shape[0]} amplitude windows of "
                                          f"{windows.shape[1:]} values")
            elif not outgoing and task == self.bank_task_name:
                check_amplitude_bank(check_envelope(shareable), self.half_widths, self.max_half_width)
        except PayloadRejected as e:
            direction = "result leaving the site" if outgoing else "data received"
            self.log_error(fl_ctx, f"task {task}: blocked the {direction}: {e}")
            raise ContentBlockedException(f"task {task}: {e}") from e
        return shareable

    def _outgoing(self, fl_ctx: FLContext) -> bool:
        return filters_outgoing(self, fl_ctx)


def filters_outgoing(flt: Filter, fl_ctx: FLContext) -> bool:
    """True when ``flt`` runs on a task result leaving the site, False on task data arriving; a filter that cannot
    tell blocks (ContentBlockedException) rather than guess."""
    direction = fl_ctx.get_prop(FLContextKey.FILTER_DIRECTION)
    if direction in (FilterKey.OUT, FilterKey.IN):
        return direction == FilterKey.OUT
    chain = flt.get_prop(FilterContextKey.CHAIN_TYPE)
    if chain in (FilterChainType.TASK_RESULT_CHAIN, FilterChainType.TASK_DATA_CHAIN):
        return chain == FilterChainType.TASK_RESULT_CHAIN
    raise ContentBlockedException(f"{type(flt).__name__} cannot tell whether it filters task data or results")
