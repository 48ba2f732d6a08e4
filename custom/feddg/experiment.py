"""The experiment model: what a ``feddg.yaml`` holds, how ``--set`` changes it, and how the whole is validated.

One module of the lowest layer holds the model, so that everything that reads or writes an experiment calls down
into it: the CLI and the sweep (``--set``, a sweep's protocol), the job template and the recipes (a job's
``feddg.yaml``), the server and the sites (:func:`load_experiment`, through :mod:`feddg.flare.job_config`).

* **Defaults**: :data:`TASK_DEFAULTS` (CPU-sized, on the synthetic data) and :data:`PAPER_SIZE` (the papers'
  setting, for GPU sites).
* **Sections**: the base sections and their checks are :mod:`feddg.config`'s (``data``, ``model``, ``train``,
  ``eval``). A method's own section is *registered* here (:func:`add_section`), not imported:
  :mod:`feddg.flare.registry` adds the section of every method part it registers, so this module knows no method.
  A process validates a job of a method after importing the registry (the CLI, the job template, the sweep and the
  sites' :mod:`feddg.flare.job_config` do); without it the method's section is an unknown key, refused by name.
* **Overrides**: ``--set`` assignments (:func:`parse_overrides`) merged into an experiment (:func:`merge`) and
  validated as a whole (:func:`experiment_from_dict`, :func:`with_overrides`).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, create_model

from feddg.config import ConfigError, FedDGConfig, StrictLoader, config_from_dict, read_yaml

# CPU-sized defaults on the synthetic data; docs/gpu.md says what to change on a GPU.
_CPU_MODEL = {"features": [16, 16, 32, 64, 128, 16], "norm": "batch", "dropout": 0.0}
_CPU_TRAIN = {"rounds": 4, "local_epochs": 10, "batch_size": 4, "lr": 1e-3, "fedprox_mu": 0.0,
              "augment": True, "seed": 0, "min_sites": None, "task_timeout": 3600, "local_steps": None}
_EVAL = {"largest_component": False, "batch_size": 32, "timeout": None}

TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "prostate": {
        "data": {
            "task": "prostate", "layout": "saml_nifti", "root": None,
            "sites": ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"], "unseen_site": "RUNMC",
            "image_size": 64, "val_fraction": 0.2, "split_seed": 0, "zscore": "volume",
            "train_empty_slices": False,
            "synthetic": {"seed": 0, "cases_per_site": 8, "slices_per_case": 12, "size": 96},
        },
        "model": _CPU_MODEL,
        "train": _CPU_TRAIN,
        "eval": _EVAL,
    },
    "fundus": {
        "data": {
            "task": "fundus", "layout": "dofe_png", "root": None,
            "sites": ["Domain1", "Domain2", "Domain3", "Domain4"], "unseen_site": "Domain1",
            "image_size": 64, "val_fraction": 0.2, "split_seed": 0, "zscore": "slice",
            "train_empty_slices": True,
            "synthetic": {"seed": 0, "cases_per_site": 24, "slices_per_case": 1, "size": 128},
        },
        # Instance norm for fundus: with BatchNorm the averaged running statistics of three domains do not fit
        # the dark, low-contrast synthetic Domain1 and the global model predicts nothing there (measured: unseen
        # Dice 0.00 with batch norm, 0.80 with instance norm, 3 rounds x 10 epochs). Prostate keeps batch norm
        # (unseen Dice 0.66 vs 0.53 with instance norm in the same comparison).
        "model": {**_CPU_MODEL, "norm": "instance"},
        # Three rounds suffice on the small fundus sites (unseen disc Dice 0.90).
        "train": {**_CPU_TRAIN, "rounds": 3},
        "eval": _EVAL,
    },
}

# The papers' setting (ELCFS section 4.2): 384 px, batch 5, one local epoch, 100 rounds. For GPU sites:
# `feddg make-jobs --paper --out DIR` writes every job with these values.
PAPER_SIZE: dict[str, Any] = {
    "data": {"image_size": 384, "synthetic": {"size": 384}},
    "model": {"features": [32, 32, 64, 128, 256, 32]},
    "train": {"rounds": 100, "local_epochs": 1, "batch_size": 5},
}

# A check relating a section to the rest of the validated experiment: ConfigError naming the field, else None.
ExperimentCheck = Callable[[FedDGConfig], None]


@dataclass(frozen=True)
class Section:
    """A method's own section of ``feddg.yaml``: its name, its schema, and the checks that relate it to the rest.

    ``settings`` is a strict pydantic model (:class:`feddg.config.Settings`) with ``Field(description=...)`` on every
    key; the experiment schema gets a key ``name`` of that type (default: the model's defaults), and a job of a
    method with this section writes it out in full. ``checks`` run on the validated experiment, after the base
    sections' own checks (:func:`feddg.config.validate`)."""

    name: str
    settings: type[BaseModel]
    description: str
    checks: tuple[ExperimentCheck, ...] = ()


_SECTIONS: dict[str, Section] = {}


def check_section(section: Section) -> None:
    """ValueError when ``section`` cannot be added: its name is a base section's or another registered section's
    (the same section object may be added again)."""
    if section.name in FedDGConfig.model_fields:
        raise ValueError(f"feddg.yaml section {section.name!r} is a base section")
    if _SECTIONS.get(section.name, section) is not section:
        raise ValueError(f"feddg.yaml section {section.name!r} is registered already")


def add_section(section: Section) -> None:
    """Add a method's section to the experiment schema (:func:`check_section` first)."""
    check_section(section)
    _SECTIONS[section.name] = section


def remove_section(name: str) -> None:
    """Remove a section added with :func:`add_section` (when no registered method uses it any more)."""
    _SECTIONS.pop(name, None)


def sections() -> dict[str, Section]:
    """The registered sections by name, in the order they were added."""
    return dict(_SECTIONS)


def experiment_schema() -> type[FedDGConfig]:
    """The schema of a whole ``feddg.yaml``: the base sections and every registered section, each defaulting to its
    model's defaults."""
    return _schema(tuple((s.name, s.settings, s.description) for s in _SECTIONS.values()))


@functools.lru_cache(maxsize=8)
def _schema(entries: tuple[tuple[str, type[BaseModel], str], ...]) -> type[FedDGConfig]:
    if not entries:
        return FedDGConfig
    fields = {name: (model, Field(default_factory=model, description=text)) for name, model, text in entries}
    return create_model("Experiment", __base__=FedDGConfig, __doc__=FedDGConfig.__doc__, **fields)


def experiment_checks() -> tuple[ExperimentCheck, ...]:
    """The registered sections' checks, in the order the sections were added."""
    return tuple(check for s in _SECTIONS.values() for check in s.checks)


def experiment_from_dict(raw: Any) -> FedDGConfig:
    """Validate a whole experiment given as plain data (a parsed ``feddg.yaml``, a checkpoint's or a run's stored
    config): :func:`feddg.config.config_from_dict` with :func:`experiment_schema` and :func:`experiment_checks`. An
    unknown section or key is refused by name."""
    return config_from_dict(raw, experiment_schema(), experiment_checks())


def load_experiment(path: str | os.PathLike) -> FedDGConfig:
    """Read and validate a job's ``feddg.yaml`` (:func:`experiment_from_dict`); errors name the file."""
    raw = read_yaml(path)
    try:
        return experiment_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any], _path: str = "") -> dict[str, Any]:
    """``base`` with ``overrides`` applied key by key, nested mappings merged (neither is changed). ConfigError
    naming the key when an override puts keys under a setting that holds a value (``train.lr.x`` under the number
    ``train.lr``, ``data.sites.HK`` under the list ``data.sites``): only sections have keys."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        where = f"{_path}{key}"
        if isinstance(value, Mapping):
            below = out.get(key, {})
            if below is not None and not isinstance(below, Mapping):
                first = next(iter(value), "")
                raise ConfigError(f"--set {where}.{first}: {where} is a setting ({type(below).__name__} "
                                  f"{below!r}), not a section, so it has no key {first!r}")
            out[key] = merge(below or {}, value, f"{where}.")
        else:
            out[key] = copy.deepcopy(value)
    return out


def task_sites(task: str, overrides: Mapping[str, Any]) -> list[str]:
    """The sites of ``task`` once ``overrides`` (an experiment's overrides, ``data.sites`` among them or not) are
    applied to the task's defaults, in their order."""
    return merge(TASK_DEFAULTS[task]["data"], overrides.get("data", {}))["sites"]


def parse_overrides(assignments: list[str]) -> dict[str, Any]:
    """``["train.rounds=20", "data.unseen_site=BMC"]`` -> ``{"train": {"rounds": 20}, "data": {"unseen_site": "BMC"}}``.

    Each value is read as YAML with the rules of ``feddg.yaml`` (``20`` an integer, ``1e-3`` a float, ``null``,
    ``[BMC, HK]`` a list, anything else a string). Whether the key exists and the value fits is the schema's
    business: merge the result into an experiment and validate it (:func:`with_overrides`), which names an unknown
    key or a wrong type. ConfigError for an assignment that is not ``dotted.key=value``, a key given twice, and a
    key under another one's value (``train.lr=1`` with ``train.lr.x=2``)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            raise ConfigError(f"--set {assignment!r}: expected section.key=value, e.g. train.rounds=20")
        dotted = ".".join(p.strip() for p in parts)
        if dotted in given:  # the last one would win silently: which one was meant?
            raise ConfigError(f"--set {dotted} given twice ({given[dotted]!r} and {assignment!r}): give it once")
        given[dotted] = assignment
        try:
            value = yaml.load(text, Loader=StrictLoader) if text.strip() else ""  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {assignment!r}: cannot read the value: {e}") from None
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part.strip(), {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {assignment!r}: {part} is set to a value by another --set")
            node = child
        if isinstance(node.get(parts[-1].strip()), dict):
            raise ConfigError(f"--set {assignment!r}: {key.strip()} is a section, not a value")
        node[parts[-1].strip()] = value
    return out


def check_task_override(overrides: Mapping[str, Any], task: str, job: str) -> None:
    """ConfigError when ``overrides`` (from :func:`parse_overrides`) set ``data.task`` to another task than the job
    ``job``'s own ``task``: a job's components, sites and layout are its task's, so the run would fail later (a
    site, 40 s in) instead of here."""
    data = overrides.get("data")
    given = data.get("task") if isinstance(data, Mapping) else None
    if given is not None and given != task:
        raise ConfigError(f"--set data.task={given}: {job} is a {task} job; run a {given} job instead "
                          f"(jobs/{given}_<method>)")


def with_overrides(experiment: Mapping[str, Any], overrides: Mapping[str, Any],
                   source: str | os.PathLike) -> tuple[dict[str, Any], FedDGConfig]:
    """``experiment`` (plain data, e.g. a job's ``feddg.yaml`` as read) with ``overrides`` merged in and validated
    as a whole: the merged data and its validated model. ConfigError naming ``source`` (the file the experiment
    came from) and the field: a key under a value, an unknown key or a wrong value. (An override of another task
    is the caller's to refuse first, naming its job: :func:`check_task_override`.)"""
    try:
        merged = merge(experiment, overrides)
        return merged, experiment_from_dict(merged)
    except ConfigError as e:
        raise ConfigError(f"{source} with --set: {e}") from None


def experiment_text(header: str, experiment: Mapping[str, Any]) -> str:
    """A ``feddg.yaml``'s text: ``header`` (comment lines, each starting with ``#``), then ``experiment`` as YAML in
    its own key order."""
    return header + yaml.safe_dump(dict(experiment), sort_keys=False, default_flow_style=False)


def read_experiment(path: str | os.PathLike) -> dict[str, Any]:
    """A ``feddg.yaml`` as plain data (not validated: :func:`with_overrides` or :func:`experiment_from_dict` do
    that); ConfigError naming the file when it is not a mapping."""
    raw = read_yaml(Path(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw
