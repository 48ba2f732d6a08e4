"""Continue a stopped run as a new job (NVFlare 2.9 has no automatic resume).

    feddg resume-job jobs/prostate_ga --from RESULT --out /tmp/feddg/prostate_ga_resumed [--rounds R]

``RESULT`` is the previous job's result: the folder ``nvflare job download`` wrote, or the server's run folder
(``<simulator workspace>/server/simulate_job``). From it the command takes what the rounds left need:

* ``feddg_progress.json`` (written by the workflow after every round): how many rounds the saved model has behind it;
* ``FL_global_model.pt``: the last good global model;
* ``ga_weights.json`` when the job aggregates with GA: the weight history, which the new job continues.

The new job is the given job folder with that state inside it (``app/config/resume/``, so it is self-contained and
carries no code) and three changed settings: the workflow's ``start_round`` (the rounds already done), the
persistor's initial checkpoint, and the GA aggregator's ``resume_from``. ``--rounds`` raises the total when the
previous run had finished all of its rounds. The new job runs rounds ``start_round .. R-1``, so the two jobs
together train exactly R rounds; GA's step-size schedule uses R as well.

MLA's kept local models are those of the final round; a resumed job keeps the local models of its own final round,
so none are carried over.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from feddg.config import load_config
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.controller import PROGRESS_FILE

RESUME_DIR = "resume"
CHECKPOINT = "FL_global_model.pt"
GA_HISTORY = "ga_weights.json"


def _find(previous: Path, name: str) -> Path | None:
    hits = sorted(previous.rglob(name), key=lambda p: len(p.parts))
    return hits[0] if hits else None


def resume_job(job: Path, previous: Path, out: Path, rounds: int | None = None) -> tuple[Path, int, int]:
    """Write the resumed job to ``out``; returns (job folder, start round, total rounds)."""
    job, previous, out = Path(job), Path(previous), Path(out)
    progress_file = _find(previous, PROGRESS_FILE)
    checkpoint = _find(previous, CHECKPOINT)
    if progress_file is None or checkpoint is None:
        raise ValueError(f"{previous}: no {PROGRESS_FILE} and {CHECKPOINT} here; point --from at the previous job's "
                         f"downloaded result or its server run folder")
    done = int(json.loads(progress_file.read_text())["rounds_completed"])
    exp = yaml.safe_load((job / "app" / "config" / CONFIG_FILE).read_text())
    total = rounds if rounds is not None else int(exp["train"]["rounds"])
    if done >= total:
        raise ValueError(f"{previous}: the previous run already trained {done} of {total} rounds; pass --rounds with "
                         f"a larger total to train further")
    if out.exists():
        raise ValueError(f"{out} exists; choose a new folder for the resumed job")
    shutil.copytree(job, out)
    config = out / "app" / "config"
    state = config / RESUME_DIR
    state.mkdir()
    shutil.copy2(checkpoint, state / CHECKPOINT)
    exp["train"]["rounds"] = total
    (config / CONFIG_FILE).write_text(f"# resumed from {previous} after {done} rounds by `feddg resume-job`\n"
                                      + yaml.safe_dump(exp, sort_keys=False))
    load_config(config / CONFIG_FILE)  # still a valid experiment

    server_path = config / "config_fed_server.json"
    server = json.loads(server_path.read_text())
    components = {c["id"]: c for c in server["components"]}
    workflows = [w for w in server["workflows"] if w["path"].endswith("LeaveOneSiteOutFedAvg")]
    if not workflows:
        raise ValueError(f"{job}: no LeaveOneSiteOutFedAvg workflow to resume")
    workflows[0].setdefault("args", {})["start_round"] = done
    persistor_id = workflows[0]["args"].get("persistor_id", "persistor")
    components[persistor_id].setdefault("args", {})["source_ckpt_file_full_name"] = f"{RESUME_DIR}/{CHECKPOINT}"
    aggregator = components.get(workflows[0]["args"].get("aggregator_id", "aggregator"), {})
    if aggregator.get("path", "").endswith("GeneralizationAdjustmentAggregator"):
        history = _find(previous, GA_HISTORY)
        if history is None:
            raise ValueError(f"{previous}: the job aggregates with GA but no {GA_HISTORY} is here")
        shutil.copy2(history, state / GA_HISTORY)
        aggregator.setdefault("args", {})["resume_from"] = f"{RESUME_DIR}/{GA_HISTORY}"
    server_path.write_text(json.dumps(server, indent=2) + "\n")

    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["name"] = f"{meta['name']}_resumed"
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return out, done, total
