"""What the runs of a results folder share and what each run adds, and how either is compared.

A protocol is the task, the ``--set`` overrides (with the data root and layout) and the simulator flags; a run is a
cell of the sweep (method, held-out site, seed). A run's ``feddg.yaml`` is the task's template for the method with
the protocol's overrides and the cell's own settings merged in (:func:`run_experiment`); the cell's settings are the
sweep's own (:func:`owned_settings`), never a protocol's. Two protocols are the same when they give every method of
the task the same ``feddg.yaml`` and the same simulator flags (:func:`protocol_difference`); the protocol of a set of
runs can be read back from their configs (:func:`protocol_from_runs`), and a run recorded under one checked against
it (:func:`run_mismatch`). Every comparison names the first differing key, dotted, with both values
(:func:`first_difference`).

A seed changes the model initialisation, the data order, the augmentation and every seed the method draws from
(``train.seed``, and any ``*_seed`` setting of the method's section, e.g. MLA's encoder and attention seeds), never
the splits (``data.split_seed``) or the synthetic data (``data.synthetic.seed``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from feddg.config import ConfigError


@dataclass(frozen=True)
class Run:
    """One cell of the sweep."""

    task: str
    method: str
    held_out: str
    seed: int

    @property
    def run_id(self) -> str:
        return f"{self.task}_{self.method}_{self.held_out}_seed{self.seed}"


@dataclass
class Protocol:
    """What every run of a results folder shares (recorded in ``sweep.json``).

    Attributes:
        task: prostate or fundus.
        overrides: nested feddg.yaml settings applied to every run (from ``--set``, the data root and layout).
        simulator_args: flags passed to the simulator (``-gpu 0``).
    """

    task: str
    overrides: dict[str, Any] = field(default_factory=dict)
    simulator_args: list[str] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        return {"task": self.task, "overrides": self.overrides, "simulator_args": self.simulator_args}


# ---------------------------------------------------------------------------------------- comparing nested settings


class _Absent:
    def __repr__(self) -> str:
        return "absent"


ABSENT: Any = _Absent()  # stands for a key that one side of a comparison lacks


class Difference(NamedTuple):
    """One leaf where two nested values differ: its path of keys and each side's value (:data:`ABSENT` for a key that
    side lacks)."""

    path: tuple[str, ...]
    left: Any
    right: Any

    @property
    def key(self) -> str:
        """The dotted key (``train.rounds``)."""
        return ".".join(self.path) or "(the whole value)"

    def describe(self, left: str, right: str) -> str:
        """``"train.rounds: 1 <left>, 7 <right>"``: the key and both values, each followed by its side's label."""
        return f"{self.key}: {_shown(self.left)} {left}, {_shown(self.right)} {right}"


def differences(a: Any, b: Any, path: tuple[str, ...] = ()) -> Iterator[Difference]:
    """Every leaf where two nested values differ, mappings walked key by key in sorted order (a key one side lacks is
    one difference, whatever the other side holds there); lists and other values compare whole."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            yield from differences(a.get(key, ABSENT), b.get(key, ABSENT), (*path, str(key)))
    elif a is ABSENT or b is ABSENT or a != b:
        yield Difference(path, a, b)


def first_difference(a: Any, b: Any) -> Difference | None:
    """The first of :func:`differences` (keys in sorted order), or None when the two are equal."""
    return next(differences(a, b), None)


def _shown(value: Any) -> str:
    return "absent" if value is ABSENT else json.dumps(value, sort_keys=True, default=str)


def as_json(value: Any) -> Any:
    """``value`` as it reads back from a JSON file (tuples become lists, keys strings): what a record holds."""
    return json.loads(json.dumps(value, default=str))


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return value


# ------------------------------------------------------------------------------------------------- a run's settings


# Settings a run's cell sets, with the option of the sweep that sets them (besides the seeds, see _is_seed_key).
_CELL_SETTINGS = {("data", "unseen_site"): "--held-out", ("data", "task"): "--task"}


def _is_seed_key(section: str, key: str) -> bool:
    """Whether a run's seed sets ``section.key``: ``train.seed`` and every ``*_seed`` of a method's section."""
    return (section, key) == ("train", "seed") or (section not in ("data", "train") and key.endswith("_seed"))


def seed_overrides(experiment: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The settings a run's seed sets: ``train.seed`` and every ``*_seed`` of a method's section; never
    ``data.split_seed`` or ``data.synthetic.seed``."""
    out: dict[str, Any] = {"train": {"seed": seed}}
    for section, values in experiment.items():
        seeds = {key: seed for key in values if _is_seed_key(section, key)} if isinstance(values, Mapping) else {}
        if seeds:
            out[section] = {**out.get(section, {}), **seeds}
    return out


def owned_settings(overrides: Mapping[str, Any]) -> list[str]:
    """One line for each setting of ``overrides`` that the sweep sets for each run from its own option (the seeds,
    the held-out site, the task), naming the setting and the option; empty when there is none."""
    found = []
    for section, values in overrides.items():
        for key in values if isinstance(values, Mapping) else {}:
            option = "--seeds" if _is_seed_key(section, key) else _CELL_SETTINGS.get((section, key))
            if option:
                found.append(f"--set {section}.{key}: the sweep sets it for each run from {option}")
    return found


def run_overrides(protocol: Protocol, run: Run) -> dict[str, Any]:
    """What the run changes in its job of the template: the protocol, the held-out site and the seed."""
    from feddg.experiment import merge
    from feddg.jobs import experiment

    delta = merge(protocol.overrides, {"data": {"unseen_site": run.held_out}})
    return merge(delta, seed_overrides(merge(experiment(run.task, run.method), delta), run.seed))


def run_experiment(protocol: Protocol, run: Run) -> dict[str, Any]:
    """The run's feddg.yaml content, validated (ConfigError naming the field otherwise)."""
    from feddg.jobs import experiment

    return experiment(run.task, run.method, run_overrides(protocol, run))


# --------------------------------------------------------------------------------------- protocols and their runs


def _method_experiments(task: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Method -> the feddg.yaml that ``overrides`` give its runs before their cell's settings, for every method of
    ``task`` (not validated: a comparison, not a run)."""
    from feddg.flare.registry import methods
    from feddg.jobs import experiment

    return {name: as_json(experiment(task, name, dict(overrides), validate=False))
            for name, spec in methods().items() if spec.supports(task)}


def protocol_difference(recorded: Mapping[str, Any], protocol: Protocol) -> str | None:
    """None when the settings ``recorded`` for a folder run every cell as ``protocol`` does: the same task and
    simulator flags and, for every method of the task, the same feddg.yaml (so an override that repeats the
    template's value is no difference); else the first difference, as ``key: <folder's value> in this folder,
    <protocol's value> in this sweep``."""
    ours = as_json(protocol.settings())
    for name in ("task", "simulator_args"):
        found = first_difference({name: recorded.get(name, ABSENT)}, {name: ours[name]})
        if found:
            return found.describe("in this folder", "in this sweep")
    theirs = _method_experiments(protocol.task, recorded.get("overrides") or {})
    found = {method: first_difference(theirs[method], settings)
             for method, settings in _method_experiments(protocol.task, protocol.overrides).items()}
    differing = [(m, d) for m, d in found.items() if d]
    if not differing:
        return None
    # a method whose template has the setting shows both values (ga.step_size in ga's runs, not absent in fedavg's)
    method, first = next(((m, d) for m, d in differing if ABSENT not in (d.left, d.right)), differing[0])
    where = "" if all(d == first for d in found.values()) else f" (in the feddg.yaml of {method}'s runs)"
    return first.describe("in this folder", "in this sweep") + where


def run_of(name: str, record: Mapping[str, Any]) -> Run:
    """The cell a run record names; ConfigError naming the run ``name`` when the record names none or has no
    config."""
    try:
        run = Run(**record["run"])
    except (KeyError, TypeError):
        raise ConfigError(f"{name}: its run.json names no run (method, held-out site, seed)") from None
    if not isinstance(record.get("config"), Mapping):
        raise ConfigError(f"{name}: its run.json holds no config")
    return run


def run_mismatch(protocol: Protocol, name: str, record: Mapping[str, Any]) -> str | None:
    """Why the run recorded in ``runs/<name>/run.json`` is not a run of ``protocol`` in that folder, or None when
    it is: it must be the run its folder is named after, of the protocol's task and simulator flags (when it records
    them), and its config exactly :func:`run_experiment` of the protocol and its cell."""
    try:
        run = run_of(name, record)
        if run.run_id != name:
            return f"its run.json is of run {run.run_id}"
        if run.task != protocol.task:
            return f"a {run.task} run in a {protocol.task} folder"
        flags = record.get("simulator_args", protocol.simulator_args)
        if flags != protocol.simulator_args:
            return f"simulator flags {_shown(flags)} in the run, {_shown(protocol.simulator_args)} in this folder"
        expected = run_experiment(protocol, run)
    except ConfigError as e:
        return str(e)
    found = first_difference(as_json(record["config"]), as_json(expected))
    return found.describe("in the run", "under this folder's protocol") if found else None


def protocol_from_runs(records: Mapping[str, Mapping[str, Any]]) -> Protocol:
    """The protocol a folder's run records show: their one task and one set of simulator flags, and as overrides
    every setting where a run's config differs from the task's template with the run's cell; checked by giving
    every run exactly its config back. ConfigError naming what stands in the way otherwise (runs of several tasks or
    simulator flags, a run that does not record its flags or lacks a setting of the template, runs that disagree on
    a setting). A setting every run shares with the template is not an override: it changes nothing."""
    from feddg.experiment import merge

    if not records:
        raise ConfigError("it holds no run to read the protocol from")
    runs = {name: run_of(name, record) for name, record in records.items()}
    task, flags = _shared_task_and_flags(runs, records)
    overrides: dict[str, Any] = {}
    for name, run in runs.items():
        for found in differences(as_json(records[name]["config"]), as_json(run_experiment(Protocol(task), run))):
            if found.left is ABSENT:
                raise ConfigError(f"run {name} lacks {found.key}, a setting of this code's template")
            overrides = merge(overrides, _nested(found.path, found.left))
    protocol = Protocol(task, overrides, flags)
    for name, run in runs.items():
        found = first_difference(as_json(records[name]["config"]), as_json(run_experiment(protocol, run)))
        if found:
            raise ConfigError(f"its runs disagree on {found.describe(f'in {name}', 'in another run')}")
    return protocol


def _shared_task_and_flags(runs: Mapping[str, Run], records: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[str]]:
    """The one task and the one list of simulator flags of the runs; ConfigError when they have several, or a run
    does not record its flags."""
    tasks = sorted({run.task for run in runs.values()})
    if len(tasks) > 1:
        raise ConfigError(f"its runs are of the tasks {tasks}")
    flags = {name: record.get("simulator_args") for name, record in records.items()}
    for name, value in flags.items():
        if not isinstance(value, list):
            raise ConfigError(f"run {name} does not record its simulator flags (made by an older feddg-flare)")
    kinds = sorted({json.dumps(value) for value in flags.values()})
    if len(kinds) > 1:
        raise ConfigError(f"its runs were made with different simulator flags: {', '.join(kinds)}")
    return tasks[0], json.loads(kinds[0])
