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

import yaml

from feddg.config import ConfigError, FedDGConfig, check_task_override, read_yaml
from feddg.flare.constants import CONFIG_FILE, TASK_REQUEST_INTERVAL, FedDGTask
from feddg.flare.registry import experiment_from_dict, merge, method, methods
from feddg.flare.site_policy import FED_EVENT_CONVERTER, TB_RECEIVER, TB_WRITER
from feddg.folders import claim
from feddg.report import REPORT_FILE

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

JOBS = [f"{task}_{name}" for name, m in methods().items() for task in TASK_DEFAULTS if m.supports(task)]


def experiment(task: str, method_name: str, overrides: dict | None = None, validate: bool = True) -> dict[str, Any]:
    """The ``feddg.yaml`` content of one job, validated unless ``validate`` is off (to compare settings);
    ConfigError for overrides that set another task (:func:`feddg.config.check_task_override`)."""
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
        f"# Generated by `feddg make-jobs` from feddg/jobs.py; edit there (or copy the job and edit freely).\n"
        f"# data.root: null trains on the embedded synthetic sites; set it to your data folder for real data.\n"
    )
    return header + yaml.safe_dump(experiment_, sort_keys=False, default_flow_style=False)


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
    :func:`feddg.config.parse_overrides`) merged into its ``feddg.yaml``, validated as a whole, and its
    ``meta.json`` following the experiment's sites. ConfigError naming the file and the field otherwise, before
    anything is written. ``claim_as``: the command that makes ``out``'s parent, marked as ours
    (:func:`feddg.folders.claim`) once the copy is accepted."""
    job, out = Path(job), Path(out)
    source = job / "app" / "config" / CONFIG_FILE
    own = read_yaml(source)
    task = (own.get("data") or {}).get("task") if isinstance(own.get("data"), dict) else None
    if isinstance(task, str):
        check_task_override(overrides, task, str(job))
    try:
        experiment_ = merge(own, overrides)
    except ConfigError as e:
        raise ConfigError(f"{source} with --set: {e}") from None
    try:
        cfg = experiment_from_dict(experiment_)
    except ConfigError as e:
        raise ConfigError(f"{source} with --set: {e}") from None
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
    (out / "app" / "config" / CONFIG_FILE).write_text(
        header + yaml.safe_dump(experiment_, sort_keys=False, default_flow_style=False))
    (out / "meta.json").write_text(_json({**meta, **job_meta(meta.get("name", job.name), cfg)}))
    return out


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"
