"""The methods this project offers, registered in one place and composed from the method folders' parts.

A method is a name and the parts it is made of (:class:`~feddg.flare.method_spec.MethodPart`, one per method folder).
Combinations are composed here, so that method folders never import each other: ELCFS + GA is ELCFS's part with
GA's; MLA-BIN is FedAvg's rounds on the BIN-Net (``model.bin_levels: 3``, MLA-BIN section 2.3) with MLA's part.
The job generator, the site's egress filter and policy, and ``feddg simulate`` read the registered methods through
this module's functions; :func:`register` adds a method (a new folder plus one registration here, or, for a method
outside the package, one call).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from feddg.config import FedDGConfig
from feddg.flare.elcfs.part import PART as ELCFS
from feddg.flare.fedavg.part import PART as FEDAVG
from feddg.flare.fedprox.part import PART as FEDPROX
from feddg.flare.ga.part import PART as GA
from feddg.flare.gradalign.part import PART as GRADALIGN
from feddg.flare.method_spec import Component, EgressCheck, MethodPart, SiteLimit, TaskFilter
from feddg.flare.mla.part import PART as MLA
from feddg.flare.uniform.part import PART as UNIFORM

BASE_EXECUTOR = "feddg.flare.executor.FedDGExecutor"


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied key by key, nested mappings merged (neither is changed)."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, Mapping) else copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Method:
    """A registered method: its name and its parts, read as one :class:`MethodPart`.

    Args:
        name: the method's name in job names (``<task>_<name>``).
        parts: the parts it is composed of; single-valued fields (executor, aggregator) may be set by one part only.
        data_tasks: the data tasks (prostate, fundus) it has jobs for, on top of what its parts allow; None: all.
    """

    name: str
    parts: tuple[MethodPart, ...]
    data_tasks: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for single in ("executor", "aggregator"):
            setters = [p for p in self.parts if getattr(p, single) is not None]
            if len(setters) > 1:
                raise ValueError(f"method {self.name!r}: {len(setters)} of its parts set the {single}")
        if self.aggregator is None:
            raise ValueError(f"method {self.name!r}: no part sets the aggregator")

    def _single(self, name: str) -> Any:
        return next((getattr(p, name) for p in self.parts if getattr(p, name) is not None), None)

    def _joined(self, name: str) -> tuple:
        return tuple(item for p in self.parts for item in getattr(p, name))

    def _merged(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.parts:
            out = merge(out, getattr(p, name))
        return out

    @property
    def executor(self) -> str:
        return self._single("executor") or BASE_EXECUTOR

    @property
    def aggregator(self) -> Component | None:
        return self._single("aggregator")

    @property
    def executor_args(self) -> dict[str, Any]:
        return self._merged("executor_args")

    @property
    def tasks(self) -> tuple[str, ...]:
        return self._joined("tasks")

    @property
    def before_rounds(self) -> tuple[Component, ...]:
        return self._joined("before_rounds")

    @property
    def after_rounds(self) -> tuple[Component, ...]:
        return self._joined("after_rounds")

    @property
    def server_components(self) -> tuple[Component, ...]:
        return self._joined("server_components")

    @property
    def round_args(self) -> dict[str, Any]:
        return self._merged("round_args")

    @property
    def result_filters(self) -> tuple[TaskFilter, ...]:
        return self._joined("result_filters")

    @property
    def data_filters(self) -> tuple[TaskFilter, ...]:
        return self._joined("data_filters")

    def experiment(self, task: str) -> dict[str, Any]:
        """What the method sets in a ``task`` job's feddg.yaml."""
        out: dict[str, Any] = {}
        for p in self.parts:
            out = merge(merge(out, p.experiment), p.task_experiment.get(task, {}))
        return out

    def inactive_reason(self, cfg: FedDGConfig) -> str | None:
        """Why the method would not act in the validated experiment ``cfg`` (its parts' reasons, joined by "; "),
        or None when every part acts: a run of it would then be another method's run under its name."""
        reasons = [p.inactive_when(cfg) for p in self.parts if p.inactive_when is not None]
        return "; ".join(r for r in reasons if r) or None

    def supports(self, task: str) -> bool:
        allowed = [p.data_tasks for p in self.parts if p.data_tasks is not None]
        if self.data_tasks is not None:
            allowed.append(self.data_tasks)
        return all(task in a for a in allowed)


_METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry; ValueError when its name is taken or a task's egress check would differ
    from a registered method's."""
    if method.name in _METHODS:
        raise ValueError(f"a method named {method.name!r} is registered already")
    known = egress_checks()
    for part in method.parts:
        for task, check in part.egress.items():
            if known.get(task, check) is not check:
                raise ValueError(f"method {method.name!r}: task {task!r} already has another egress check")
    _METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method added with :func:`register` (tests register toy methods)."""
    _METHODS.pop(name, None)


def methods() -> dict[str, Method]:
    """The registered methods by name, in the order of registration."""
    return dict(_METHODS)


def method(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; the methods are {list(_METHODS)}") from None


def _parts() -> list[MethodPart]:
    seen: dict[int, MethodPart] = {}
    for m in _METHODS.values():
        for p in m.parts:
            seen.setdefault(id(p), p)
    return list(seen.values())


def egress_checks() -> dict[str, EgressCheck]:
    """Task -> what a site lets out on it, for every method's own tasks (the shared tasks' checks are the egress
    filter's own)."""
    return {task: check for part in _parts() for task, check in part.egress.items()}


def train_meta() -> set[str]:
    """The scalar meta keys the methods' executors add to a training result (beyond the shared ones)."""
    return {key for part in _parts() for key in part.train_meta}


def site_limits() -> dict[str, SiteLimit]:
    """The limits the methods' egress checks read, by name."""
    return {limit.name: limit for part in _parts() for limit in part.site_limits}


def site_data_filters() -> list[Component]:
    """What a site's policy checks on the incoming data of the methods' tasks."""
    found: dict[str, Component] = {}
    for part in _parts():
        for component in part.site_data_filters:
            found.setdefault(component.path, component)
    return list(found.values())


def simulated_site_config(component_paths: Iterable[str]) -> dict[str, Any]:
    """The ``local/feddg_site.json`` settings that ``feddg simulate`` writes for a job whose configs name
    ``component_paths``: those of every part whose executor or components the job uses."""
    paths = set(component_paths)
    out: dict[str, Any] = {}
    for part in _parts():
        named = {part.executor, *(c.path for c in (*part.before_rounds, *part.after_rounds, *part.server_components))}
        if paths & (named - {None}):
            out = merge(out, part.simulated_site_config)
    return out


# MLA-BIN's BIN-Net (section 2.3): BIN blocks in the top three encoder levels.
BIN_NET = MethodPart(experiment={"model": {"bin_levels": 3}})

for _method in (
    Method("fedavg", (FEDAVG,)),
    Method("uniform", (UNIFORM,)),
    Method("fedprox", (FEDAVG, FEDPROX)),
    Method("ga", (GA,)),
    Method("gradalign", (GRADALIGN,)),
    Method("elcfs", (FEDAVG, ELCFS)),
    Method("elcfs_ga", (GA, ELCFS)),
    Method("mlabin", (FEDAVG, BIN_NET, MLA)),
):
    register(_method)
