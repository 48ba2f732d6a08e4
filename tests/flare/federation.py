"""Task delivery for workflow component tests: real site executors behind real filters, no NVFlare processes."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nvflare.apis.client import Client
from nvflare.apis.controller_spec import ClientTask, Task
from nvflare.apis.executor import Executor
from nvflare.apis.filter import Filter
from nvflare.apis.fl_constant import FilterKey, FLContextKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal

Tamper = Callable[[Shareable], Shareable]


class Federation:
    """Answers a controller's ``broadcast_and_wait`` the way NVFlare's client runners would.

    At each target site the task data passes ``in_filters()`` in order, the site's executor (a fresh
    ``executor()``, as in a fresh process) runs the task, ``tamper[site]`` may rewrite the result of
    ``tampered_task`` (a site sending more than the contract allows), and the result passes ``out_filters()``
    in order. A result that a filter blocks becomes the empty ``TASK_RESULT_FILTER_ERROR`` reply that NVFlare's
    client runner sends instead; a blocked task data raises, as it would stop the site's task.

    Args:
        contexts: each site's FLContext (site name -> context), from ``tests.flare.fl_context.make_context``.
        executor: makes the site executor.
        in_filters / out_filters: make a site's task-data and task-result filters.
        tampered_task: the task whose results ``tamper`` rewrites.
        tamper: site name -> how that site rewrites its result.

    ``targets`` records each broadcast as (task name, target sites).
    """

    def __init__(self, contexts: Mapping[str, FLContext], executor: Callable[[], Executor],
                 in_filters: Callable[[], list[Filter]], out_filters: Callable[[], list[Filter]],
                 tampered_task: str, tamper: Mapping[str, Tamper] | None = None):
        self.sites = dict(contexts)
        self.executor = executor
        self.in_filters = in_filters
        self.out_filters = out_filters
        self.tampered_task = tampered_task
        self.tamper = dict(tamper or {})
        self.targets: list[tuple[str, list[str]]] = []

    def broadcast_and_wait(self, task: Task, fl_ctx: FLContext, targets: list[str], min_responses: int,
                           abort_signal: Signal | None = None, **_) -> None:
        self.targets.append((task.name, list(targets)))
        for site in targets:
            ctx = self.sites[site]
            ctx.set_prop(FLContextKey.TASK_NAME, task.name, private=True, sticky=False)
            ctx.set_prop(FLContextKey.FILTER_DIRECTION, FilterKey.IN, private=True, sticky=False)
            data = task.data
            for f in self.in_filters():
                data = f.process(data, ctx)
            result = self.executor().execute(task.name, data, ctx, Signal())
            if task.name == self.tampered_task and site in self.tamper:
                result = self.tamper[site](result)
            ctx.set_prop(FLContextKey.FILTER_DIRECTION, FilterKey.OUT, private=True, sticky=False)
            try:
                for f in self.out_filters():
                    result = f.process(result, ctx)
            except Exception:  # what NVFlare's client runner does when a result filter blocks
                result = Shareable()
                result.set_return_code(ReturnCode.TASK_RESULT_FILTER_ERROR)
            client_task = ClientTask(Client(site, None), task)
            client_task.result = result
            task.client_tasks.append(client_task)
