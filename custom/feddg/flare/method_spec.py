"""What a method folder contributes to a job, as data: the job generator, the experiment schema, the site's egress
filter, the simulator, ``feddg resume-job`` and the benchmark read these fields and never a method's name.

A method folder (``feddg.flare.<method>``) describes its contribution in one :class:`MethodPart` (its ``part.py``):
its ``feddg.yaml`` section and the checks that relate it to the rest of the experiment, its NVFlare components, the
site hooks that add to a training result, and the server files it writes. :mod:`feddg.flare.registry` composes the
methods the project offers from these parts (ELCFS + GA = ELCFS's local training with GA's aggregation; MLA-BIN =
the BIN net trained with FedAvg rounds, then the MLA phase), so method folders never import each other.

This module and every ``part.py`` are import-light (pydantic, no torch, no NVFlare): the CLI lists methods and site
limits from them without loading the training stack. Heavy code a part refers to (egress checks, plots) is imported
when it is called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from feddg.config import FedDGConfig
from feddg.experiment import Section, merge

if TYPE_CHECKING:
    from nvflare.apis.dxo import DXO

# A check of what may leave a site on one task: (the result's DXO, the job's experiment, the site's limits).
EgressCheck = Callable[["DXO", FedDGConfig, Mapping[str, Any]], None]
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
class SiteHook:
    """A site-side contribution to the local training of a round (:class:`feddg.flare.site_hooks.TrainingHook`).

    The hook is a client component of the job (``component``, with an id), checked by the site's allow-list like
    any other; the sites' executor calls it around its local training and adds what it returns to the training
    result's metadata. ``sends`` names those metadata keys: they are all it may add, the site's egress filter lets
    them out on the train task, and no two parts may send the same key."""

    component: Component
    sends: tuple[str, ...]

    def __post_init__(self) -> None:
        # the executor finds its hooks by component id: a hook without one would be configured as nothing
        if not self.component.id:
            raise ValueError(f"site hook {self.component.path}: its Component needs an id (the executor's "
                             f"site_hooks argument names the hooks by id)")


@dataclass(frozen=True)
class ServerFile:
    """A file a part's server component writes into the job's server run folder.

    Args:
        name: the file name (``ga_weights.json``).
        writer: the class path of the server component that writes it.
        resume_arg: the writer's argument that names a copy to continue from; with it the file is carried forward
            by ``feddg resume-job``. A resumable file is a round history: JSON ``{"history": [{"round": r, ...},
            ...]}`` whose last round must be the one the resumed checkpoint was saved after.
        keep: the benchmark keeps the file with each run (``run.json`` gets its JSON content under the file's stem).
        plot: ``module:function`` drawing the kept file across a sweep's runs: ``f(records) -> Figure``, given
            the finished runs' records that hold it (imported when called); the benchmark saves the figure as
            ``<key>.png`` beside its tables.
    """

    name: str
    writer: str
    resume_arg: str | None = None
    keep: bool = False
    plot: str | None = None

    @property
    def key(self) -> str:
        """The file's key in a run record: its name without the extension."""
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class SavedModel:
    """A model a part's server saves beside the global model (MLA's bundle), which ``feddg evaluate`` scores next
    to it at a hospital outside the federation.

    Args:
        name: the model's name in the tables' rows and the JSON (``mla``).
        option: its ``feddg evaluate`` option (``--bundle``), whose value is the saved model's path.
        help: the option's help.
        scorer: ``module:function`` opening the saved model at a path: ``f(path) -> scorer`` with ``.path``, ``.config``
            (the experiment it was trained in) and ``.score(test, device, largest_component) -> (summaries, info)``
            (``{"test": summary}`` as :func:`feddg.evaluation.evaluate_sliceset` gives, and a JSON-able dict or
            None), and ``.describe(site, info) -> str`` (one line for the console); ValueError naming the path when
            it cannot be opened. Imported when called.
    """

    name: str
    option: str
    help: str
    scorer: str


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
    section: Section | None = None  # its own feddg.yaml section
    site_hooks: tuple[SiteHook, ...] = ()  # what it adds around the sites' local training
    server_files: tuple[ServerFile, ...] = ()  # the files its server components write
    saved_models: tuple[SavedModel, ...] = ()  # models its server saves that `feddg evaluate` can score
    name: str = ""  # how errors name the part (its folder), e.g. "ga"


BASE_EXECUTOR = "feddg.flare.executor.FedDGExecutor"


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
        """The executor's arguments from every part, with ``site_hooks`` (the hooks' ids) when a part has any."""
        args = self._merged("executor_args")
        if self.site_hooks:
            args["site_hooks"] = [h.component.id for h in self.site_hooks]
        return args

    @property
    def site_hooks(self) -> tuple[SiteHook, ...]:
        return self._joined("site_hooks")

    @property
    def server_files(self) -> tuple[ServerFile, ...]:
        return self._joined("server_files")

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
        """What the method sets in a ``task`` job's feddg.yaml: each part's own section in full (its defaults),
        then what the part sets, then what it sets for ``task``."""
        out: dict[str, Any] = {}
        for p in self.parts:
            if p.section is not None:
                out = merge(out, {p.section.name: p.section.settings().model_dump()})
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
