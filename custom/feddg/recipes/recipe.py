"""``FedDGRecipe``: one NVFlare 2.9 Recipe per registered method, built from the method's registered parts.

The job a recipe builds is the job :mod:`feddg.jobs` describes (its ``feddg.yaml``, server and client configs and
``meta.json``), as real NVFlare objects in a plain :class:`~nvflare.job_config.api.FedJob`: every component is
instantiated from its class path with the registry's arguments, so an export writes today's classic layout::

    <name>/meta.json                          deploy_map {"app": ["server", <every site>]}
    <name>/app/config/config_fed_server.json
    <name>/app/config/config_fed_client.json
    <name>/app/config/feddg.yaml

and no ``app/custom`` folder: the sites run their installed packages, under their class allow-list.

Not ``BaseFedJob``, which adds components that are not on the sites' allow-list. Where NVFlare 2.9.0's export
would write something else, the recipe sets it right (each checked in the installed source):

* ``to_clients`` deploys to ``@ALL`` and ``to(obj, site)`` writes one app per site: the deploy map is given as
  ``meta_props`` (``job_config/fed_job_config.py`` merges them last);
* without ``set_app_packages`` the export copies the imported modules of the components into ``app/custom``
  (bring-your-own-code, refused by the sites' policy): the components' top-level packages are app packages;
* the export drops an argument equal to its default: every component gets ``_always_serialize_args`` (an instance
  attribute, on ours and NVFlare's alike) naming exactly the registry's arguments;
* a base class's arguments are read only through a literal ``*args, **kwargs`` (``fuel/utils/class_utils.py``):
  the executors that extend :class:`~feddg.flare.executor.FedDGExecutor` say so, and a test checks that every
  exported argument equals the registry's.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvflare.job_config.api import FedJob
from nvflare.job_config.defs import FilterType
from nvflare.private.fed.app.fl_conf import FL_PACKAGES
from nvflare.recipe.spec import ExecEnv, Recipe

from feddg.config import FedDGConfig
from feddg.experiment import TASK_DEFAULTS, experiment_from_dict
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.method_spec import Method
from feddg.flare.registry import method, methods
from feddg.flare.site_policy import component_paths
from feddg.jobs import JOBS, client_config, experiment, experiment_file, job_meta, server_config


def job_names() -> list[str]:
    """``<task>_<method>`` of every registered method and every data task it supports (the committed jobs first,
    then the jobs of methods registered from outside the package)."""
    extra = [f"{task}_{name}" for name, m in methods().items() for task in TASK_DEFAULTS if m.supports(task)]
    return list(dict.fromkeys([*JOBS, *extra]))


def split_job(name: str) -> tuple[str, str]:
    """``prostate_elcfs_ga`` -> ``("prostate", "elcfs_ga")``; ValueError listing the known jobs otherwise."""
    task, _, method_name = name.partition("_")
    known = job_names()
    if name not in known:
        raise ValueError(f"unknown job {name!r}; the jobs are {', '.join(known)}")
    return task, method_name


class FedDGRecipe(Recipe):
    """The job of ``method`` on the data task ``task`` as an NVFlare Recipe (see the module docstring).

    Args:
        task: the data task (``prostate``, ``fundus``).
        method: a registered method's name (:func:`feddg.flare.registry.methods`), also one registered from
            outside the package through the ``feddg.methods`` entry points.
        overrides: nested ``feddg.yaml`` settings on top of the task's and the method's (``--set``, parsed by
            :func:`feddg.experiment.parse_overrides`).
        name: the job's name (default ``<task>_<method>``): the export's folder and ``meta.json`` name.

    Raises:
        ValueError: an unknown task or method (listing the known ones), a method without jobs for ``task``.
        ConfigError: the experiment with ``overrides`` is invalid (naming the key; nothing is built then).
    """

    def __init__(self, task: str, method: str, overrides: Mapping[str, Any] | None = None,
                 name: str | None = None) -> None:
        spec = _method(method)
        if task not in TASK_DEFAULTS:
            raise ValueError(f"unknown data task {task!r}; the tasks are {', '.join(TASK_DEFAULTS)}")
        if not spec.supports(task):
            raise ValueError(f"method {method!r} has no {task} job")
        self.task, self.method = task, method
        # The experiment is validated first: an invalid one builds no FedJob.
        self.experiment: dict[str, Any] = experiment(task, method, dict(overrides or {}))
        self.config: FedDGConfig = experiment_from_dict(self.experiment)
        name = name or f"{task}_{method}"
        self.server_config, self.client_config = server_config(method), client_config(method)
        self.meta = job_meta(name, self.config)
        super().__init__(_build_job(name, self.meta, self.server_config, self.client_config,
                                    self._experiment_source(name)))

    @property
    def sites(self) -> list[str]:
        """The job's sites (``data.sites``), the held-out one included: the simulator's clients."""
        return list(self.config.data.sites)

    @property
    def component_paths(self) -> set[str]:
        """Every class path the job's configs name."""
        return component_paths([self.server_config, self.client_config])

    def process_env(self, env: ExecEnv) -> None:
        """Hand the job's needs to a project environment before it deploys (:meth:`prepare_for` on the env, when it
        has one: the simulator's sites and site settings)."""
        prepare = getattr(env, "prepare_for", None)
        if prepare is not None:
            prepare(self)

    def _experiment_source(self, name: str) -> Path:
        """``feddg.yaml`` in a folder of this recipe's own, removed with the recipe: NVFlare copies a file source
        into the app's config folder when it exports or runs the job."""
        folder = Path(tempfile.mkdtemp(prefix="feddg_recipe_"))
        weakref.finalize(self, shutil.rmtree, folder, True)
        source = folder / CONFIG_FILE
        source.write_text(experiment_file(name, self.experiment))
        return source


def _method(name: str) -> Method:
    try:
        return method(name)
    except ValueError:
        raise ValueError(f"unknown method {name!r}; the methods are {', '.join(methods())}") from None


def _build_job(name: str, meta: Mapping[str, Any], server: Mapping[str, Any], client: Mapping[str, Any],
               experiment_source: Path) -> FedJob:
    """A plain FedJob holding ``server`` and ``client`` (config dicts as :mod:`feddg.jobs` writes them) as objects,
    deployed as one app to the server and the sites of ``meta``'s deploy map, with ``experiment_source`` as the
    app's ``config/feddg.yaml``."""
    job = FedJob(name=name, min_clients=meta["min_clients"], meta_props={"deploy_map": meta["deploy_map"]})
    packages = sorted({path.split(".")[0] for path in component_paths([server, client])} - set(FL_PACKAGES))
    job.set_app_packages(packages)  # no app/custom: the sites run their installed packages
    for workflow in server["workflows"]:
        job.to_server(component(workflow), id=workflow["id"])
    for entry in server["components"]:
        job.to_server(component(entry), id=entry["id"])
    params = {key: value for key, value in server.items() if key not in ("format_version", "workflows", "components")}
    if params:  # top-level settings of the server's config: {"server": {"task_request_interval": ...}}
        job.to_server(params)
    job.add_file_to_server(str(experiment_source), app_folder_type="config")
    for executor in client["executors"]:
        job.to_clients(component(executor["executor"]), tasks=list(executor["tasks"]))
    for key, filter_type in (("task_data_filters", FilterType.TASK_DATA),
                             ("task_result_filters", FilterType.TASK_RESULT)):
        for group in client[key]:
            for entry in group["filters"]:
                job.to_clients(component(entry), tasks=list(group["tasks"]), filter_type=filter_type)
    for entry in client["components"]:
        job.to_clients(component(entry), id=entry["id"])
    return job


def component(entry: Mapping[str, Any]) -> Any:
    """The object a config entry ``{"path": "module.Class", "args": {...}}`` names, built with its arguments and
    marked so that the export writes exactly these arguments (``_always_serialize_args``), defaults included.

    ImportError / TypeError naming the entry's path when the class cannot be imported or refuses the arguments."""
    module_name, _, class_name = entry["path"].rpartition(".")
    args = dict(entry.get("args", {}))
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"component {entry['path']}: cannot import it: {e}") from e
    try:
        obj = cls(**args)
    except TypeError as e:
        raise TypeError(f"component {entry['path']} with arguments {sorted(args)}: {e}") from e
    obj._always_serialize_args = tuple(args)
    return obj
