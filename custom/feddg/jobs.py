"""One template for every job folder under ``jobs/``.

This module describes each job (its experiment, its server and client configs, its ``meta.json``);
:mod:`feddg.recipes` builds an NVFlare Recipe from that description and the committed job folders are the recipes'
exports (``feddg make-jobs``), so they cannot drift apart; a test checks that the committed folders equal the
exports byte for byte. A job is a classic NVFlare folder that
``nvflare simulator`` and ``nvflare job submit`` both accept and that carries no custom code: the sites run the
installed ``feddg`` package.

    jobs/<task>_<method>/
      meta.json                       deploy_map: one app for the server and every site (no -n needed)
      app/config/config_fed_server.json
      app/config/config_fed_client.json
      app/config/feddg.yaml           the experiment: sites, unseen site, data, model, training (one truth)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from feddg.config import ConfigError, FedDGConfig
from feddg.experiment import (TASK_DEFAULTS, check_task_override, experiment_from_dict, experiment_text, merge,
                              read_experiment, with_overrides)
from feddg.flare.constants import CONFIG_FILE, TASK_REQUEST_INTERVAL, FedDGTask
from feddg.flare.registry import method, methods
from feddg.flare.site_policy import FED_EVENT_CONVERTER, TB_RECEIVER, TB_WRITER
from feddg.folders import claim
from feddg.report import REPORT_FILE

JOBS = [f"{task}_{name}" for name, m in methods().items() for task in TASK_DEFAULTS if m.supports(task)]


def experiment(task: str, method_name: str, overrides: dict | None = None, validate: bool = True) -> dict[str, Any]:
    """The ``feddg.yaml`` content of one job: the task's defaults, the method's own settings and sections, then
    ``overrides``; validated unless ``validate`` is off (to compare settings). ConfigError for overrides that set
    another task (:func:`feddg.experiment.check_task_override`)."""
    check_task_override(overrides or {}, task, f"{task}_{method_name}")
    raw = merge(merge(TASK_DEFAULTS[task], method(method_name).experiment(task)), overrides or {})
    if validate:
        experiment_from_dict(raw)  # fail here, not in a site's process
    return raw


def server_config(method_name: str) -> dict[str, Any]:
    """The server's config: the method's workflows around the leave-one-site-out rounds, its aggregator and
    components, the persistor and TensorBoard."""
    m = method(method_name)
    rounds = {"config_file": CONFIG_FILE, "aggregator_id": "aggregator", "persistor_id": "persistor",
              "report_file": REPORT_FILE, **m.round_args}
    return {
        "format_version": 2,
        "server": {"task_request_interval": TASK_REQUEST_INTERVAL},
        "workflows": [
            *(c.config() for c in m.before_rounds),
            {"id": "leave_one_site_out", "path": "feddg.flare.controller.LeaveOneSiteOutFedAvg", "args": rounds},
            *(c.config() for c in m.after_rounds),
        ],
        "components": [
            {"id": "persistor", "path": "feddg.flare.persistor.FedDGModelPersistor",
             "args": {"config_file": CONFIG_FILE}},
            m.aggregator.config("aggregator"),
            *(c.config() for c in m.server_components),
            {"id": "tb_receiver", "path": TB_RECEIVER,
             "args": {"events": ["fed.analytix_log_stats", "analytix_log_stats"]}},
        ],
    }


def client_config(method_name: str) -> dict[str, Any]:
    """The sites' config: the method's executor, its site hooks, and the job filters of its exchanges (which read
    the job's ``feddg.yaml`` at run time: no value derived from the experiment is written here)."""
    m = method(method_name)
    return {
        "format_version": 2,
        "executors": [{
            "tasks": [FedDGTask.SITE_INFO, FedDGTask.TRAIN, FedDGTask.EVALUATE, *m.tasks],
            "executor": {"id": "executor", "path": m.executor,
                         "args": {"config_file": CONFIG_FILE, "tb_writer_id": "tb_writer", **m.executor_args}},
        }],
        "task_data_filters": [{"tasks": list(f.tasks), "filters": [f.filter.config()]} for f in m.data_filters],
        "task_result_filters": [{"tasks": list(f.tasks), "filters": [f.filter.config()]} for f in m.result_filters],
        "components": [
            *(hook.component.config() for hook in m.site_hooks),
            {"id": "tb_writer", "path": TB_WRITER, "args": {}},
            {"id": "fed_event_converter", "path": FED_EVENT_CONVERTER,
             "args": {"events_to_convert": ["analytix_log_stats"], "fed_event_prefix": "fed."}},
        ],
    }


def experiment_file(name: str, experiment_: dict[str, Any]) -> str:
    """The text of a job's ``feddg.yaml``: a header, then ``experiment_`` (from :func:`experiment`) in YAML."""
    header = (
        f"# {name}: the experiment that the server and every site of this job read.\n"
        f"# Generated by `feddg make-jobs` from feddg/experiment.py (the defaults) and feddg/jobs.py (the job); edit\n"
        f"# there (or copy the job and edit freely).\n"
        f"# data.root: null trains on the embedded synthetic sites; set it to your data folder for real data.\n"
    )
    return experiment_text(header, experiment_)


def job_meta(name: str, cfg: FedDGConfig) -> dict[str, Any]:
    """A job's ``meta.json``: one app for the server and every site, the minimum clients from the experiment."""
    return {
        "name": name,
        "resource_spec": {},
        "deploy_map": {"app": ["server", *cfg.data.sites]},
        "min_clients": cfg.train.min_sites or len(cfg.data.train_sites),
    }


def override_job(job: Path, overrides: dict[str, Any], out: Path, claim_as: str = "") -> Path:
    """A copy of the job folder ``job`` at ``out`` (replaced if it exists) with ``overrides`` (from
    :func:`feddg.experiment.parse_overrides`) merged into its ``feddg.yaml``, validated as a whole, and its
    ``meta.json`` following the experiment's sites. ConfigError naming the file and the field otherwise, before
    anything is written. ``claim_as``: the command that makes ``out``'s parent, marked as ours
    (:func:`feddg.folders.claim`) once the copy is accepted."""
    job, out = Path(job), Path(out)
    source = job / "app" / "config" / CONFIG_FILE
    own = read_experiment(source)
    task = own.get("data", {}).get("task") if isinstance(own.get("data"), dict) else None
    if isinstance(task, str):
        check_task_override(overrides, task, str(job))
    experiment_, cfg = with_overrides(own, overrides, source)
    meta = json.loads((job / "meta.json").read_text()) if (job / "meta.json").exists() else {}
    if set((meta.get("deploy_map") or {"app": []})) != {"app"}:
        raise ConfigError(f"{job / 'meta.json'}: --set needs the one-app deploy map of the generated jobs "
                          f"({{\"app\": [\"server\", sites...]}})")
    if claim_as:
        claim(out.parent, claim_as)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(job, out)
    header = f"# {job.name} with --set {json.dumps(overrides, sort_keys=True)}, written by feddg.\n"
    (out / "app" / "config" / CONFIG_FILE).write_text(experiment_text(header, experiment_))
    (out / "meta.json").write_text(_json({**meta, **job_meta(meta.get("name", job.name), cfg)}))
    return out


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"
