"""NVFlare's own rounds on this machine, as anchors for ours (``benchmarks/round_time.py --anchors``).

Two jobs, each run in NVFlare's simulator like ours, with one site process per client and the sites' thread
budget (``FEDDG_SITE_PROCESSES``):

* ``trivial``: NVFlare's own NumPy job, nothing to compute: ``ScatterAndGather`` with its defaults (task check
  period 0.5 s), ``NPTrainer``, ``NPModelPersistor`` and the in-time weighted aggregator, one client per training
  site of the protocol, ``task_request_interval`` as our jobs set it. Its round is the floor of NVFlare's
  machinery on this host: what any job's round costs besides its own work.
* ``recipe``: what a user would pick instead of our app, NVFlare 2.9's PyTorch FedAvg recipe
  (``nvflare.app_opt.pt.recipes.fedavg.FedAvgRecipe``, the client script in process), training the same U-Net
  on the same sites' data with the same batches, epochs, learning rate and validation per round (the script is
  :mod:`anchor_train`, next to this file). Only the training sites take part (ours also starts the held-out site's
  process, idle until the end).

A round's time is read from the server log: the median gap between NVFlare's consecutive ``Round N started`` lines
(rounds 1 and later; round 0 also loads the data). An anchor that cannot be built (an NVFlare class missing) is
skipped with the reason, never reported as a number.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from feddg.benchmark.launch import SimulatorRun, run_simulator
from feddg.compute import SITE_PROCESSES_ENV
from feddg.flare.constants import TASK_REQUEST_INTERVAL
from feddg.simulate import simulator_command

HERE = Path(__file__).resolve().parent
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
ROUND_STARTED = re.compile(r"Round (\d+) started\.")


class AnchorUnavailable(RuntimeError):
    """An anchor that cannot be built here (its NVFlare class missing); the reason is reported instead."""


def round_times(log: Path) -> list[float]:
    """Seconds between consecutive ``Round N started`` lines of a simulator log, rounds 1 and later."""
    starts: dict[int, float] = {}
    stamp = None  # a record's time: its first line's; FedAvg logs the words on a later line of a framed message
    for line in log.read_text(errors="replace").splitlines():
        if (found := STAMP.match(line)) is not None:
            stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        match = ROUND_STARTED.search(line)
        if match and stamp is not None:
            starts.setdefault(int(match.group(1)), stamp)
    rounds = sorted(starts)
    return [starts[b] - starts[a] for a, b in zip(rounds, rounds[1:]) if a >= 1 and b == a + 1]


def trivial_job(out: Path, clients: list[str], rounds: int) -> Path:
    """NVFlare's own NumPy job (see the module docstring) as a classic job folder under ``out``."""
    try:
        from nvflare.app_common.aggregators.intime_accumulate_model_aggregator import (  # noqa: F401
            InTimeAccumulateWeightedAggregator)
        from nvflare.app_common.np.np_model_persistor import NPModelPersistor  # noqa: F401
        from nvflare.app_common.np.np_trainer import NPTrainer  # noqa: F401
        from nvflare.app_common.workflows.scatter_and_gather import ScatterAndGather  # noqa: F401
    except ImportError as e:
        raise AnchorUnavailable(f"NVFlare's NumPy job cannot be built here: {e}") from None
    job = out / "nvflare_trivial"
    shutil.rmtree(job, ignore_errors=True)
    config = job / "app" / "config"
    config.mkdir(parents=True)
    server = {
        "format_version": 2,
        "server": {"task_request_interval": TASK_REQUEST_INTERVAL},
        "workflows": [{"id": "scatter_and_gather",
                       "path": "nvflare.app_common.workflows.scatter_and_gather.ScatterAndGather",
                       "args": {"min_clients": len(clients), "num_rounds": rounds, "wait_time_after_min_received": 0,
                                "aggregator_id": "aggregator", "persistor_id": "persistor",
                                "shareable_generator_id": "shareable_generator"}}],
        "components": [
            {"id": "persistor", "path": "nvflare.app_common.np.np_model_persistor.NPModelPersistor", "args": {}},
            {"id": "shareable_generator",
             "path": "nvflare.app_common.shareablegenerators.full_model_shareable_generator."
                     "FullModelShareableGenerator", "args": {}},
            {"id": "aggregator",
             "path": "nvflare.app_common.aggregators.intime_accumulate_model_aggregator."
                     "InTimeAccumulateWeightedAggregator", "args": {"expected_data_kind": "WEIGHTS"}},
        ],
    }
    client = {"format_version": 2,
              "executors": [{"tasks": ["train"], "executor": {
                  "path": "nvflare.app_common.np.np_trainer.NPTrainer", "args": {}}}],
              "task_result_filters": [], "task_data_filters": [], "components": []}
    (config / "config_fed_server.json").write_text(json.dumps(server, indent=2))
    (config / "config_fed_client.json").write_text(json.dumps(client, indent=2))
    (job / "meta.json").write_text(json.dumps({"name": "nvflare_trivial", "resource_spec": {},
                                               "min_clients": len(clients),
                                               "deploy_map": {"app": ["server", *clients]}}, indent=2))
    return job


def recipe_job(out: Path, feddg_yaml: Path, clients: list[str], rounds: int) -> Path:
    """NVFlare 2.9's PyTorch FedAvg recipe training our U-Net with :mod:`anchor_train` (see the module docstring),
    exported as a job folder under ``out``."""
    try:
        from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe
    except ImportError as e:
        raise AnchorUnavailable(f"NVFlare's PyTorch FedAvg recipe cannot be built here: {e}") from None
    from feddg.experiment import load_experiment
    from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections

    cfg = load_experiment(feddg_yaml)
    # The network as the recipe's model config (class and arguments: what feddg.nets.unet.build_model passes), so
    # that the server builds exactly our U-Net.
    model = {"class_path": "feddg.nets.unet.FedDGUNet",
             "args": {"in_channels": cfg.data.in_channels, "out_channels": len(cfg.data.label_names),
                      "features": list(cfg.model.features), "norm": cfg.model.norm, "dropout": cfg.model.dropout,
                      "bin_levels": cfg.model.bin_levels}}
    recipe = FedAvgRecipe(name="nvflare_fedavg_recipe", model=model, min_clients=len(clients), num_rounds=rounds,
                          train_script=str(HERE / "anchor_train.py"), train_args=f"--config {feddg_yaml}")
    target = out / "recipe_export"
    shutil.rmtree(target, ignore_errors=True)
    recipe.export(str(target))
    job = target / "nvflare_fedavg_recipe"
    meta = json.loads((job / "meta.json").read_text())
    app = next(iter(meta["deploy_map"]))
    meta["deploy_map"] = {app: ["server", *clients]}
    (job / "meta.json").write_text(json.dumps(meta, indent=2))
    return job


def nvflare_simulator_run(job: Path, workspace: Path, log: Path, clients: list[str]) -> SimulatorRun:
    """The shared launcher (a session of its own; on a timeout every process it started is stopped) around NVFlare's
    simulator, one process per client: the anchors are NVFlare's jobs, not ours, so they do not go through
    ``feddg simulate``, but they run in its simulator runner (:func:`feddg.simulate.simulator_command`: NVFlare's,
    with the race closed that can give two clients one name and stall the run). The clients get the sites' thread
    budget (``FEDDG_SITE_PROCESSES``), which :mod:`anchor_train` applies as our sites do."""
    command = simulator_command(job, workspace, ["-t", str(len(clients)), "-c", ",".join(clients)])
    return SimulatorRun(job, workspace, log, env={SITE_PROCESSES_ENV: str(len(clients))}, command=command)


def run_anchor(job: Path, workspace: Path, clients: list[str], timeout: float) -> dict[str, Any]:
    """Run an anchor job in the simulator, one process per client; its rounds' times from the log (a run that lost
    NVFlare's port race is started once more: :func:`~feddg.benchmark.launch.run_simulator`). RuntimeError naming
    the job and its log when it fails or no round time can be read."""
    if workspace.exists():
        shutil.rmtree(workspace)
    log = workspace.parent / f"{workspace.name}.log"
    ended = run_simulator(nvflare_simulator_run(job, workspace, log, clients), timeout)
    times = round_times(log) if log.exists() else []
    if ended.status != "ok" or ended.returncode != 0 or not times:
        raise RuntimeError(f"{job.name}: {ended.reason or f'exit {ended.returncode}'}"
                           f"{'' if times else ', no round times in its log'}; see {log}")
    return {"wall_s": ended.wall_s, "round_s": statistics.median(times), "rounds_timed": len(times),
            "simulator_starts": ended.attempts, "log": str(log)}


def measure(out: Path, feddg_yaml: Path, clients: list[str], rounds: int, timeout: float) -> dict[str, Any]:
    """Both anchors (``{"trivial": ..., "recipe": ...}``), each a measurement or ``{"skipped": reason}``."""
    results: dict[str, Any] = {}
    for name, build in (("trivial", lambda: trivial_job(out, clients, rounds)),
                        ("recipe", lambda: recipe_job(out, feddg_yaml, clients, rounds))):
        try:
            job = build()
        except AnchorUnavailable as e:
            results[name] = {"skipped": str(e)}
            continue
        print(f"anchor {name}: {job} in the simulator ({len(clients)} clients) ...", flush=True)
        results[name] = run_anchor(job, out / f"workspace_{name}", clients, timeout)
    return results
