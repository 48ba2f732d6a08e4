"""One template for every job folder under ``jobs/``.

The committed job folders are this module's output (``feddg make-jobs``), so they cannot drift apart; a test
checks that the committed folders equal what the generator writes. A job is a classic NVFlare folder that
``nvflare simulator`` and ``nvflare job submit`` both accept and that carries no custom code: the sites run the
installed ``feddg`` package.

    jobs/<task>_<method>/
      meta.json                       deploy_map: one app for the server and every site (no -n needed)
      app/config/config_fed_server.json
      app/config/config_fed_client.json
      app/config/feddg.yaml           the experiment: sites, unseen site, data, model, training (one truth)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from feddg.config import ELCFSConfig, GAConfig, GradAlignConfig, MLAConfig, config_from_dict
from feddg.flare.constants import CONFIG_FILE, FedDGTask
from feddg.flare.site_policy import FED_EVENT_CONVERTER, TB_RECEIVER, TB_WRITER

# CPU-sized defaults on the synthetic data; the README's "paper-sized" section says what to change on a GPU.
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

# Each method: which aggregator the server uses, what the sites' executor sends, what it changes in the experiment.
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {
        "aggregator": {"path": "feddg.flare.fedavg.aggregator.SampleSizeAggregator", "args": {}},
        "executor_args": {},
        "overrides": {},
    },
    "ga": {
        "aggregator": {"path": "feddg.flare.ga.aggregator.GeneralizationAdjustmentAggregator",
                       "args": {"config_file": CONFIG_FILE}},
        "executor_args": {"send_generalization_gap": True},
        "overrides": {"ga": GAConfig().model_dump()},
    },
    # The paper trains one local iteration per round (train.local_steps: 1); the CPU default keeps the whole
    # local epochs of the other jobs so that the comparison with FedAvg holds.
    "gradalign": {
        "aggregator": {"path": "feddg.flare.gradalign.aggregator.GradientAlignmentAggregator",
                       "args": {"config_file": CONFIG_FILE}},
        "executor_args": {"send_weight_diff": True},
        "overrides": {"gradalign": GradAlignConfig().model_dump()},
    },
}

# ELCFS (section 4.2): gamma = 0.1 for fundus, 0.5 for prostate; the rest of the elcfs section keeps the paper's
# values (alpha 0.01 with a 3 x 3 floor at CPU sizes, lambda ~ U(0, 1), beta 1e-3, tau 0.05, first order).
_ELCFS = {
    "executor": "feddg.flare.elcfs.executor.ELCFSExecutor",
    "exchange": True,
    # The elcfs section is written out in full; contrast_denominator "all": see feddg/methods/boundary.py (measured).
    "overrides": {"elcfs": {**ELCFSConfig().model_dump(), "contrast_denominator": "all"}},
    "task_overrides": {"prostate": {"elcfs": {"boundary_weight": 0.5}},
                       "fundus": {"elcfs": {"boundary_weight": 0.1}}},
}
METHODS["elcfs"] = {**METHODS["fedavg"], **_ELCFS}
METHODS["elcfs_ga"] = {**METHODS["ga"], **_ELCFS, "tasks": ["prostate"],
                        "overrides": {**METHODS["ga"]["overrides"], **_ELCFS["overrides"]}}

# MLA-BIN: BIN-Net (BIN blocks in the top 3 encoder levels, section 2.3) trained with FedAvg, then MLA (section
# 2.2): the server keeps the final local models of the sites that opt in, builds the domain feature bank, trains
# the domain attention module and evaluates the attention-combined model everywhere (feddg/flare/mla/workflow.py).
# The mla section is written out in full so that a job copy can switch to `encoder: global` and the like.
METHODS["mlabin"] = {
    **METHODS["fedavg"],
    "executor": "feddg.flare.mla.executor.MLAExecutor",
    "mla": True,
    "overrides": {"model": {"bin_levels": 3}, "mla": MLAConfig().model_dump()},
}

JOBS = [f"{task}_{method}" for method, spec in METHODS.items() for task in TASK_DEFAULTS
        if task in spec.get("tasks", TASK_DEFAULTS)]


def _merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def experiment(task: str, method: str, overrides: dict | None = None) -> dict[str, Any]:
    """The ``feddg.yaml`` content of one job, validated."""
    spec = METHODS[method]
    raw = _merge(_merge(TASK_DEFAULTS[task], spec["overrides"]), spec.get("task_overrides", {}).get(task, {}))
    raw = _merge(raw, overrides or {})
    config_from_dict(raw)  # fail here, not in a site's process
    return raw


def server_config(method: str) -> dict[str, Any]:
    exchange = [{
        "id": "amplitude_exchange",
        "path": "feddg.flare.elcfs.exchange.AmplitudeExchange",
        "args": {"config_file": CONFIG_FILE},
    }] if METHODS[method].get("exchange") else []
    mla = METHODS[method].get("mla", False)
    controller_args = {"config_file": CONFIG_FILE, "aggregator_id": "aggregator", "persistor_id": "persistor",
                       "report_file": "feddg_report.json"}
    after = []
    if mla:
        controller_args["keep_local_models"] = True
        after.append({
            "id": "mla",
            "path": "feddg.flare.mla.workflow.MLAWorkflow",
            "args": {"config_file": CONFIG_FILE, "persistor_id": "persistor", "report_file": "feddg_report.json"},
        })
    return {
        "format_version": 2,
        "workflows": [*exchange, {
            "id": "leave_one_site_out",
            "path": "feddg.flare.controller.LeaveOneSiteOutFedAvg",
            "args": controller_args,
        }, *after],
        "components": [
            {"id": "persistor", "path": "feddg.flare.persistor.FedDGModelPersistor",
             "args": {"config_file": CONFIG_FILE}},
            {"id": "aggregator", **METHODS[method]["aggregator"]},
            {"id": "tb_receiver", "path": TB_RECEIVER,
             "args": {"events": ["fed.analytix_log_stats", "analytix_log_stats"]}},
        ],
    }


def client_config(method: str) -> dict[str, Any]:
    """The sites' config: the method's executor, and the job filters of its exchanges (which read the job's
    ``feddg.yaml`` at run time: no value derived from the experiment is written here)."""
    spec = METHODS[method]
    tasks = [FedDGTask.SITE_INFO, FedDGTask.TRAIN, FedDGTask.EVALUATE]
    data_filters, result_filters = [], []
    if spec.get("exchange"):
        tasks += [FedDGTask.AMPLITUDE_SPECTRA, FedDGTask.AMPLITUDE_BANK]
        guard = {"path": "feddg.flare.elcfs.filter.AmplitudeWindowFilter", "args": {"config_file": CONFIG_FILE}}
        result_filters.append({"tasks": [FedDGTask.AMPLITUDE_SPECTRA], "filters": [guard]})
        data_filters.append({"tasks": [FedDGTask.AMPLITUDE_BANK], "filters": [guard]})
    if spec.get("mla"):
        tasks += [FedDGTask.MLA_FEATURES, FedDGTask.MLA_EVALUATE]
        guard = {"path": "feddg.flare.mla.filter.FeatureMatrixFilter", "args": {"config_file": CONFIG_FILE}}
        result_filters.append({"tasks": [FedDGTask.MLA_FEATURES], "filters": [guard]})
    return {
        "format_version": 2,
        "executors": [{
            "tasks": tasks,
            "executor": {"id": "executor", "path": spec.get("executor", "feddg.flare.executor.FedDGExecutor"),
                         "args": {"config_file": CONFIG_FILE, "tb_writer_id": "tb_writer",
                                  **spec["executor_args"]}},
        }],
        "task_data_filters": data_filters,
        "task_result_filters": result_filters,
        "components": [
            {"id": "tb_writer", "path": TB_WRITER, "args": {}},
            {"id": "fed_event_converter", "path": FED_EVENT_CONVERTER,
             "args": {"events_to_convert": ["analytix_log_stats"], "fed_event_prefix": "fed."}},
        ],
    }


def render_job(name: str, overrides: dict | None = None) -> dict[str, str]:
    """Relative path -> file content of one job folder."""
    task, method = name.split("_", 1)
    if name not in JOBS and (task not in TASK_DEFAULTS or method not in METHODS):
        raise ValueError(f"unknown job {name!r}; the jobs are {JOBS}")
    exp = experiment(task, method, overrides)
    cfg = config_from_dict(exp)
    meta = {
        "name": name,
        "resource_spec": {},
        "deploy_map": {"app": ["server", *cfg.data.sites]},
        "min_clients": cfg.train.min_sites or len(cfg.data.train_sites),
    }
    header = (
        f"# {name}: the experiment that the server and every site of this job read.\n"
        f"# Generated by `feddg make-jobs` from feddg/jobs.py; edit there (or copy the job and edit freely).\n"
        f"# data.root: null trains on the embedded synthetic sites; set it to your data folder for real data.\n"
    )
    return {
        "meta.json": _json(meta),
        "app/config/config_fed_server.json": _json(server_config(method)),
        "app/config/config_fed_client.json": _json(client_config(method)),
        f"app/config/{CONFIG_FILE}": header + yaml.safe_dump(exp, sort_keys=False, default_flow_style=False),
    }


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def write_job(out_dir: Path, name: str, overrides: dict | None = None) -> Path:
    job_dir = Path(out_dir) / name
    for rel, content in render_job(name, overrides).items():
        path = job_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return job_dir


def stale_files(jobs_dir: Path) -> list[str]:
    """Files under ``jobs_dir`` that differ from what the generator writes (empty when up to date)."""
    stale = []
    for name in JOBS:
        for rel, content in render_job(name).items():
            path = Path(jobs_dir) / name / rel
            if not path.exists() or path.read_text() != content:
                stale.append(str(path))
    return stale
