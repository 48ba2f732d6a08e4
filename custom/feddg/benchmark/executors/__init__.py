"""Where the sweep's runs go: ``feddg benchmark --executor local|ray|flare`` (:mod:`.base` is the seam).

Each executor is a module of this package that declares, import-light (no torch, nvflare or ray at import):

* ``add_arguments(group)``: its own command-line options, in the benchmark command's argument group;
* ``from_args(args) -> CellExecutor``: the executor built from those options when ``--executor`` names it, every
  option of its own checked first (:class:`~.base.ExecutorError` naming the option).

This module only lists them; adding an executor is a module plus a line in :data:`EXECUTORS`.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from feddg.benchmark.executors.base import Cell, CellExecutor, ExecutorError, Outcome

DEFAULT = "local"
EXECUTORS = {  # --executor NAME -> the module that implements it
    "local": "feddg.benchmark.executors.local",
    "ray": "feddg.benchmark.executors.ray_cluster",
    "flare": "feddg.benchmark.executors.flare",
}

__all__ = ["Cell", "CellExecutor", "DEFAULT", "EXECUTORS", "ExecutorError", "Outcome", "add_executor_arguments",
           "executor_from_args"]


def _modules() -> dict[str, ModuleType]:
    """Name -> module of every executor that is installed in this checkout."""
    found = {}
    for name, module in EXECUTORS.items():
        try:
            found[name] = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # the module is there but one of its imports is not: a real error
                raise
    return found


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--executor`` and every executor's own options, in one argument group of ``parser``."""
    modules = _modules()
    group = parser.add_argument_group("where the runs go")
    group.add_argument("--executor", choices=list(modules), default=DEFAULT,
                       help=f"run the cells here ({DEFAULT}, the default), on a Ray cluster (ray) or as jobs of a "
                            f"provisioned NVFlare deployment (flare)")
    for module in modules.values():
        module.add_arguments(group)


def executor_from_args(args: argparse.Namespace) -> CellExecutor:
    """The executor ``args.executor`` names, built from its options (:class:`ExecutorError` naming a bad one)."""
    name = getattr(args, "executor", None) or DEFAULT
    module = _modules().get(name)
    if module is None:
        raise ExecutorError(f"--executor {name}: not one of {list(_modules())}")
    return module.from_args(args)
