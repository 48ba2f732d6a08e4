"""The one base of the project's NVFlare filters: each filter only says which check a task's payload must pass.

A :class:`PayloadFilter` finds, for the task and the direction at hand, the check of the payload contract that
applies (:meth:`PayloadFilter.check_for`; None lets the payload pass untouched), runs the envelope check
(:func:`feddg.flare.payloads.check_envelope`: nothing outside the DXO and its headers, no arrays in the headers)
and then the contract's check with the job's experiment, read from the job's ``feddg.yaml`` at run time (so no
filter argument can go stale when the YAML is edited). A payload that fails is blocked: the filter logs the task,
the direction and the reason (never the values) and raises :class:`~nvflare.apis.filter.ContentBlockedException`,
so NVFlare sends an error reply instead. An outgoing error reply (no DXO) carries nothing and always passes.
"""

from __future__ import annotations

from collections.abc import Callable

from nvflare.apis.dxo import DXO
from nvflare.apis.filter import ContentBlockedException, Filter, FilterChainType, FilterContextKey
from nvflare.apis.fl_constant import FilterKey, FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable

from feddg.config import ConfigError, FedDGConfig
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.job_config import load_job_config
from feddg.flare.payloads import PayloadRejected, check_envelope

# A contract's check: (the payload's DXO or None, the job's experiment) -> a line for the log, or None.
Check = Callable[[DXO | None, FedDGConfig], str | None]


class PayloadFilter(Filter):
    """Base class: subclasses implement :meth:`check_for`.

    Args:
        config_file: the job's experiment file, relative to the app's config folder.
    """

    log_prefix = ""  # how the filter's log lines and refusals begin (the site's own filter says "site policy: ")

    def __init__(self, config_file: str = CONFIG_FILE):
        super().__init__()
        self.config_file = config_file
        self._configs: dict[str, FedDGConfig] = {}

    def check_for(self, task: str, outgoing: bool) -> Check | None:
        """The check the payload of ``task`` must pass in this direction, or None to let it pass untouched."""
        raise NotImplementedError

    def process(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        task = fl_ctx.get_prop(FLContextKey.TASK_NAME)
        outgoing = filters_outgoing(self, fl_ctx)
        check = self.check_for(task, outgoing)
        if check is None:
            return shareable
        direction = "result leaving the site" if outgoing else "data received"
        try:
            dxo = check_envelope(shareable)
            if dxo is None and outgoing:
                return shareable  # an error reply carries nothing
            note = check(dxo, self.job_config(fl_ctx))
        except PayloadRejected as e:
            self.log_error(fl_ctx, f"{self.log_prefix}task {task}: blocked the {direction}: {e}")
            raise ContentBlockedException(f"{self.log_prefix}task {task}: {e}") from e
        if note:
            self.log_info(fl_ctx, f"task {task}: {note}")
        return shareable

    def job_config(self, fl_ctx: FLContext) -> FedDGConfig:
        """The running job's experiment (read once per job); PayloadRejected when it cannot be read, since a
        payload cannot be checked against an unknown experiment."""
        job = fl_ctx.get_job_id() or ""
        if job not in self._configs:
            try:
                self._configs[job] = load_job_config(fl_ctx, self.config_file)
            except ConfigError as e:
                raise PayloadRejected(f"the job's experiment is unknown ({e})") from e
        return self._configs[job]


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
