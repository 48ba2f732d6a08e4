"""The methods this project offers, registered in one place and composed from the method folders' parts.

A method is a name and the parts it is made of (:class:`~feddg.flare.method_spec.MethodPart`, one per method folder).
Combinations are composed here, so that method folders never import each other: ELCFS + GA is ELCFS's part with
GA's; MLA-BIN is FedAvg's rounds on the BIN-Net (``model.bin_levels: 3``, MLA-BIN section 2.3) with MLA's part.
The job generator, the site's egress filter and policy, ``feddg simulate``, ``feddg resume-job`` and the benchmark
read the registered methods through this module's functions and never a method's name; registering a method adds
its parts' ``feddg.yaml`` sections to the experiment model (:func:`feddg.experiment.add_section`), which knows no
method.

Adding a method: a new folder plus one registration here, or, for a method outside the package, an entry point in
the group ``feddg.methods`` of the package that holds it (``module:attribute``, a :class:`Method` or a sequence of
them), which every process that reads a job (the CLI, the server, the sites) registers when it imports this module.
Registration refuses a name, a ``feddg.yaml`` section, a site hook's metadata key or a server file that another
part has already, naming both.

Import-light: this module and the parts import neither torch nor NVFlare (the CLI lists the methods from it).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata
from typing import Any

from feddg.experiment import add_section, check_section, merge, remove_section
from feddg.flare.elcfs.part import PART as ELCFS
from feddg.flare.fedavg.part import PART as FEDAVG
from feddg.flare.fedprox.part import PART as FEDPROX
from feddg.flare.ga.part import PART as GA
from feddg.flare.gradalign.part import PART as GRADALIGN
from feddg.flare.method_spec import Component, EgressCheck, Method, MethodPart, SavedModel, ServerFile, SiteLimit
from feddg.flare.mla.part import PART as MLA
from feddg.flare.uniform.part import PART as UNIFORM

ENTRY_POINT_GROUP = "feddg.methods"


_METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry.

    ValueError when its name is taken, or when one of its parts declares what another part (of this method or of a
    registered one) has already: a feddg.yaml section, a site hook's metadata key, a server file, or another egress
    check for a task; the message names both parts."""
    if method.name in _METHODS:
        raise ValueError(f"a method named {method.name!r} is registered already")
    registered = _parts()
    claims: dict[tuple[str, str], MethodPart] = {}
    for part in registered + [p for p in method.parts if all(p is not q for q in registered)]:
        for claim in _claims(part):
            other = claims.setdefault(claim, part)
            if other is not part:
                kind, value = claim
                raise ValueError(f"method {method.name!r}: part {part.name or '?'!r} declares the {kind} {value!r}, "
                                 f"which part {other.name or '?'!r} declares already")
    known = egress_checks()
    for part in method.parts:
        for task, check in part.egress.items():
            if known.get(task, check) is not check:
                raise ValueError(f"method {method.name!r}: task {task!r} already has another egress check")
        if part.section is not None:
            try:
                check_section(part.section)  # refused before anything is registered
            except ValueError as e:
                raise ValueError(f"method {method.name!r}: part {part.name or '?'!r}: {e}") from None
    _METHODS[method.name] = method
    for part in method.parts:
        if part.section is not None:
            add_section(part.section)
    return method


def _claims(part: MethodPart) -> list[tuple[str, str]]:
    """What a part declares that no other part may: its section, its hooks' metadata keys, its server files."""
    out = [("feddg.yaml section", part.section.name)] if part.section is not None else []
    out += [("site hook metadata key", key) for hook in part.site_hooks for key in hook.sends]
    out += [("server file", f.name) for f in part.server_files]
    out += [("saved model", m.name) for m in part.saved_models] + [("evaluate option", m.option)
                                                                     for m in part.saved_models]
    return out


def unregister(name: str) -> None:
    """Remove a method added with :func:`register` (tests register toy methods), and from the experiment schema
    the sections that no registered method uses any more."""
    gone = _METHODS.pop(name, None)
    kept = {id(p) for p in _parts()}
    for part in gone.parts if gone is not None else ():
        if part.section is not None and id(part) not in kept:
            remove_section(part.section.name)


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
    """The scalar meta keys the methods' executors and site hooks add to a training result (beyond the shared
    ones)."""
    return {key for part in _parts() for key in (*part.train_meta, *(k for h in part.site_hooks for k in h.sends))}


def hook_sends(hook_class: type) -> tuple[str, ...]:
    """The metadata keys the site hook ``hook_class`` is declared to send (by its class path); () when no
    registered part declares it."""
    path = f"{hook_class.__module__}.{hook_class.__qualname__}"
    return next((h.sends for part in _parts() for h in part.site_hooks if h.component.path == path), ())


def server_files() -> tuple[ServerFile, ...]:
    """Every server file the registered parts declare (``feddg resume-job`` carries the resumable ones, the
    benchmark keeps and plots the kept ones)."""
    return tuple(f for part in _parts() for f in part.server_files)


def saved_models() -> tuple[SavedModel, ...]:
    """The models the registered parts save beside the global model (``feddg evaluate`` scores them)."""
    return tuple(m for part in _parts() for m in part.saved_models)


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

def register_entry_points() -> list[str]:
    """Register the methods that installed packages declare in the entry-point group ``feddg.methods``; the names
    registered. An entry point that cannot be loaded or registered raises, naming it (a job of such a method would
    otherwise fail at a site with an unknown section)."""
    added = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = entry.load()
            for m in (value if isinstance(value, (list, tuple)) else [value]):
                if m.name not in _METHODS or _METHODS[m.name] is not m:
                    added.append(register(m).name)
        except Exception as e:  # noqa: BLE001 - any failure of a plug-in is named
            raise ImportError(f"entry point {entry.name!r} = {entry.value!r} (group {ENTRY_POINT_GROUP}): {e}") from e
    return added


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
register_entry_points()
