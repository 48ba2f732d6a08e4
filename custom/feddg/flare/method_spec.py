"""What a method folder contributes to a job, as data: the job generator, the site's egress filter and the simulator
read these fields and never a method's name.

A method folder (``feddg.flare.<method>``) describes its contribution in one :class:`MethodPart` (its ``part.py``);
:mod:`feddg.flare.registry` composes the methods the project offers from these parts (ELCFS + GA = ELCFS's local
training with GA's aggregation; MLA-BIN = the BIN net trained with FedAvg rounds, then the MLA phase), so method
folders never import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nvflare.apis.dxo import DXO

from feddg.config import FedDGConfig

# A check of what may leave a site on one task: (the result's DXO, the job's experiment, the site's limits).
EgressCheck = Callable[[DXO, FedDGConfig, Mapping[str, Any]], None]
# Why a method cannot act in an experiment (one line), or None when it can: read from the validated feddg.yaml.
InactiveWhen = Callable[[FedDGConfig], str | None]


@dataclass(frozen=True)
class Component:
    """An NVFlare component as a job config names it: a class path and its arguments."""

    path: str
    args: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None  # the component's id where other components refer to it

    def config(self, default_id: str | None = None) -> dict[str, Any]:
        """The entry of a ``config_fed_*.json`` list."""
        entry: dict[str, Any] = {"path": self.path, "args": dict(self.args)}
        if self.id or default_id:
            entry = {"id": self.id or default_id, **entry}
        return entry


@dataclass(frozen=True)
class TaskFilter:
    """A job filter on some tasks' data (arriving at a site) or results (leaving it)."""

    tasks: tuple[str, ...]
    filter: Component


@dataclass(frozen=True)
class SiteLimit:
    """A limit a site's egress filter applies to a method's payload, whatever the job asks (an argument of
    :class:`~feddg.flare.egress_filter.SiteEgressFilter` and an option of ``feddg install-policy``)."""

    name: str  # the argument's name, e.g. "max_half_width"
    default: int | None  # None: no cap unless the site sets one
    help: str


@dataclass(frozen=True)
class MethodPart:
    """One method folder's contribution to a job. Every field is optional; the registry merges the parts of a
    method and refuses two parts that set the same single-valued field (two executors, two aggregators)."""

    executor: str | None = None  # the sites' executor class; None: the base executor
    executor_args: Mapping[str, Any] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()  # tasks of the executor beyond the shared ones (site_info, train, evaluate)
    aggregator: Component | None = None
    before_rounds: tuple[Component, ...] = ()  # server workflows that run before the federated rounds
    after_rounds: tuple[Component, ...] = ()  # server workflows that run after them
    server_components: tuple[Component, ...] = ()  # further server components, each with an id
    round_args: Mapping[str, Any] = field(default_factory=dict)  # arguments of the rounds' workflow
    result_filters: tuple[TaskFilter, ...] = ()
    data_filters: tuple[TaskFilter, ...] = ()
    site_data_filters: tuple[Component, ...] = ()  # what a site's policy checks on incoming task data; an argument
    # that is None takes the site limit of that name
    experiment: Mapping[str, Any] = field(default_factory=dict)  # what the method sets in feddg.yaml
    task_experiment: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # ... per task
    data_tasks: tuple[str, ...] | None = None  # the data tasks (prostate, fundus) it has jobs for; None: all
    egress: Mapping[str, EgressCheck] = field(default_factory=dict)  # task -> what may leave a site on it
    train_meta: tuple[str, ...] = ()  # scalar meta keys its executor adds to a training result
    site_limits: tuple[SiteLimit, ...] = ()  # the limits its egress checks read
    simulated_site_config: Mapping[str, Any] = field(default_factory=dict)  # local/feddg_site.json settings that
    # `feddg simulate` writes for its sites, which are all the user's own (MLA: share the local model)
    inactive_when: InactiveWhen | None = None  # given the validated experiment, the one-line reason why the part
    # would not act (GA with one round, gradient alignment with two sites), else None; None: it always acts
