"""Continue a stopped run as a new job (NVFlare 2.9 has no automatic resume).

    feddg resume-job jobs/prostate_ga --from RESULT --out /tmp/feddg/prostate_ga_resumed [--rounds R]

``RESULT`` is the previous job's result: the folder ``nvflare job download`` wrote, or the server's run folder
(``<simulator workspace>/server/simulate_job``). From it the command takes what the rounds left need:

* ``feddg_progress.json`` (written by the workflow after every round): how many rounds the saved model has behind it;
* ``FL_global_model.pt``: the last good global model;
* the round histories of the job's methods that its server components continue (the registry's resumable server
  files, :class:`feddg.flare.method_spec.ServerFile`: GA's ``ga_weights.json``, whose weights the new job continues).

The new job is the given job folder with that state inside it (``app/config/resume/``, so it is self-contained and
carries no code) and changed settings: the workflow's ``start_round`` (the rounds already done), the persistor's
initial checkpoint, and, for each carried history, its writer's resume argument (GA's ``resume_from``). Its ``feddg.yaml`` is the job's
configuration written out in full (every default explicit) with ``train.rounds`` set to the total. ``--rounds``
raises the total when the previous run had finished all of its rounds. The new job runs rounds
``start_round .. R-1``, so the two jobs together train exactly R rounds; GA's step-size schedule uses R as well.

The result is checked as a whole before anything is written, and refused (ValueError naming the file and what is
wrong) unless:

* the checkpoint is a model the job can continue: it loads, its weights fit the network of the configuration stored
  with it and are finite (:func:`feddg.inference.read_checkpoint`), and that configuration trains the job's
  experiment (:data:`SAME_EXPERIMENT`: each differing setting is named with both values);
* the progress file and the checkpoint are of one save: the workflow stores its run id and the rounds done with
  the model and in the progress file (:mod:`feddg.flare.controller`), and both must agree. A progress file without
  a run id (written by a feddg release before this check) or a checkpoint without them is refused: such a result
  cannot show that its two files belong together;
* each carried history ends with the round the checkpoint was saved after.

The new job is built in a temporary folder next to ``--out`` and renamed into place at the end, so a failure leaves
nothing behind and the command can simply be run again.

MLA's kept local models are those of the final round; a resumed job keeps the local models of its own final round,
so none are carried over.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from feddg.config import FedDGConfig
from feddg.experiment import experiment_from_dict, load_experiment
from feddg.flare.constants import CONFIG_FILE, GLOBAL_MODEL_FILE, FedDGMeta
from feddg.flare.controller import PROGRESS_FILE, ROUNDS_COMPLETED
from feddg.flare.method_spec import ServerFile
from feddg.flare.registry import server_files
from feddg.flare.site_policy import component_entries
from feddg.inference import read_checkpoint
from feddg.jsonfile import read_json_object

RESUME_DIR = "resume"
CHECKPOINT = GLOBAL_MODEL_FILE
WORKFLOW = "LeaveOneSiteOutFedAvg"
# The settings a resumed job shares with the run it continues: the job's feddg.yaml against the configuration stored
# in the checkpoint (a section name stands for every setting in it).
SAME_EXPERIMENT = ("data.task", "data.sites", "data.unseen_site", "data.image_size", "model")


def resume_job(job: Path, previous: Path, out: Path, rounds: int | None = None) -> tuple[Path, int, int]:
    """Write the resumed job to ``out``; returns (job folder, start round, total rounds). See the module docstring
    for what is checked; ValueError (naming the file) when something is wrong, with nothing written."""
    job, previous, out = Path(job), Path(previous), Path(out)
    if out.exists():
        raise ValueError(f"{out} exists; choose a new folder for the resumed job")
    if rounds is not None and rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    config = job / "app" / "config"
    job_cfg = load_experiment(config / CONFIG_FILE)
    server_path, meta_path = config / "config_fed_server.json", job / "meta.json"
    server, meta = read_json_object(server_path), read_json_object(meta_path)
    if not isinstance(meta.get("name"), str):
        raise ValueError(f"{meta_path}: no job name (a string under 'name')")
    workflow, persistor = _resumable_parts(server, server_path)

    progress_file, checkpoint = _find(previous, PROGRESS_FILE), _find(previous, CHECKPOINT)
    if progress_file is None or checkpoint is None:
        raise ValueError(f"{previous}: no {PROGRESS_FILE} and {CHECKPOINT} here; point --from at the previous job's "
                         f"downloaded result or its server run folder")
    done = _rounds_done(progress_file, checkpoint, job_cfg, config / CONFIG_FILE)
    total = rounds if rounds is not None else job_cfg.train.rounds
    if done >= total:
        raise ValueError(f"{previous}: the previous run already trained {done} of {total} rounds; pass --rounds with "
                         f"a larger total to train further")
    histories = _carried_histories(server, previous, done)

    # Everything is checked: the new settings, then the new job, built aside and moved into place.
    experiment = job_cfg.to_dict()
    experiment["train"]["rounds"] = total
    experiment_from_dict(experiment)  # still a valid experiment
    workflow.setdefault("args", {})["start_round"] = done
    persistor.setdefault("args", {})["source_ckpt_file_full_name"] = f"{RESUME_DIR}/{CHECKPOINT}"
    for file, (writers, _) in histories.items():
        for writer in writers:
            writer.setdefault("args", {})[file.resume_arg] = f"{RESUME_DIR}/{file.name}"
    meta["name"] = f"{meta['name']}_resumed"
    with _built_in_place_of(out) as new_job:
        shutil.copytree(job, new_job)
        state = new_job / "app" / "config" / RESUME_DIR
        state.mkdir()
        shutil.copy2(checkpoint, state / CHECKPOINT)
        for file, (_, found) in histories.items():
            shutil.copy2(found, state / file.name)
        (new_job / "app" / "config" / CONFIG_FILE).write_text(
            f"# resumed from {previous} after {done} rounds by `feddg resume-job`\n"
            + yaml.safe_dump(experiment, sort_keys=False))
        (new_job / "app" / "config" / server_path.name).write_text(json.dumps(server, indent=2) + "\n")
        (new_job / meta_path.name).write_text(json.dumps(meta, indent=2) + "\n")
    return out, done, total


def _find(previous: Path, name: str) -> Path | None:
    """The file called ``name`` nearest the top of ``previous`` (a resumed run's result also holds the copies its
    job carried, deeper down in ``config/resume/``)."""
    hits = sorted(previous.rglob(name), key=lambda p: len(p.parts))
    return hits[0] if hits else None


def _carried_histories(server: dict[str, Any], previous: Path,
                       done: int) -> dict[ServerFile, tuple[list[dict[str, Any]], Path]]:
    """The resumable server files of the job (those whose writer the server config names) -> (the writers' entries
    in ``server``, to be edited; the file found in ``previous``), each checked against the rounds ``done``."""
    carried = {}
    for file in server_files():
        writers = [entry for entry in component_entries(server) if entry.get("path") == file.writer]
        if file.resume_arg is None or not writers:
            continue
        found = _find(previous, file.name)
        if found is None:
            raise ValueError(f"{previous}: the job's {file.writer.rsplit('.', 1)[-1]} continues {file.name}, which "
                             f"is not here")
        _check_history(found, done)
        carried[file] = (writers, found)
    return carried


def _resumable_parts(server: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workflow and persistor entries of a server config (dicts inside ``server``, to be edited)."""
    workflows = [w for w in server.get("workflows", []) if isinstance(w, dict)
                 and str(w.get("path", "")).endswith(WORKFLOW)]
    if not workflows:
        raise ValueError(f"{path}: no {WORKFLOW} workflow to resume")
    args = workflows[0].get("args", {})
    components = {c.get("id"): c for c in server.get("components", []) if isinstance(c, dict)}
    persistor_id = args.get("persistor_id", "persistor")
    if persistor_id not in components:
        raise ValueError(f"{path}: the workflow's persistor {persistor_id!r} is not among the components")
    return workflows[0], components[persistor_id]


def _rounds_done(progress_file: Path, checkpoint: Path, job_cfg: FedDGConfig, job_config: Path) -> int:
    """The rounds behind the checkpoint, once the progress file and the checkpoint are shown to be of one save
    and the checkpoint to be a model of the job's experiment."""
    progress = read_json_object(progress_file)
    done, run = progress.get("rounds_completed"), progress.get("run_id")
    if isinstance(done, bool) or not isinstance(done, int) or done < 1:
        what = "is missing" if done is None else f"must be a whole number of at least 1, got {done!r}"
        raise ValueError(f"{progress_file}: rounds_completed {what}; not a progress file the workflow wrote")
    if not isinstance(run, str) or not run:
        raise ValueError(f"{progress_file}: no run_id, so nothing shows that {CHECKPOINT} is the model saved after "
                         f"those {done} rounds (progress files of feddg releases before resume-checking lack it); "
                         f"the run cannot be resumed safely")
    saved = read_checkpoint(checkpoint)
    saved_run, saved_done = saved.meta.get(FedDGMeta.RUN_ID), saved.meta.get(ROUNDS_COMPLETED)
    if saved_run is None or saved_done is None:
        raise ValueError(f"{checkpoint}: the model does not record the run and round it was saved after, so "
                         f"nothing shows that it belongs to {progress_file}; the run cannot be resumed safely")
    if saved_run != run:
        raise ValueError(f"{checkpoint} and {progress_file} come from two different runs (model saved by run "
                         f"{saved_run}, progress of run {run}); point --from at the result of one run")
    if saved_done != done:
        raise ValueError(f"{checkpoint} was saved after {saved_done} round(s), but {progress_file} records {done}; "
                         f"the two were not written by one save")
    differences = [f"{key}: job {mine!r}, checkpoint {theirs!r}"
                   for key, mine, theirs in _differences(job_cfg.to_dict(), saved.config.to_dict())]
    if differences:
        raise ValueError(f"{checkpoint}: the previous run trained another experiment than {job_config}: "
                         + "; ".join(differences))
    return done


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, job's value, checkpoint's value) for each setting of :data:`SAME_EXPERIMENT` that differs."""
    found = []
    for key in SAME_EXPERIMENT:
        a, b = _at(mine, key), _at(theirs, key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += [(f"{key}.{k}", a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
        elif a != b:
            found.append((key, a, b))
    return found


def _at(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _check_history(path: Path, done: int) -> None:
    """A carried round history must end with the round the checkpoint was saved after (round ``done - 1``)."""
    history = read_json_object(path).get("history")
    if not isinstance(history, list):
        raise ValueError(f"{path}: no round history (a list under 'history')")
    last = history[-1].get("round") if history and isinstance(history[-1], dict) else None
    if last != done - 1:
        ends = f"ends with round {last}" if history else "is empty"
        raise ValueError(f"{path}: the history {ends}, but the model was saved after round {done - 1}; the two were "
                         f"not written by one run up to the same round")


@contextmanager
def _built_in_place_of(out: Path) -> Iterator[Path]:
    """A folder path to build ``out`` at: inside a temporary folder next to ``out`` (so on the same file system),
    renamed to ``out`` when the block ends. On an error the temporary folder is removed, and so are the parent
    folders made for it: nothing is left behind."""
    made = [p for p in out.parents if not p.exists()]  # nearest first
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield scratch / out.name
        if out.exists():  # made by someone else meanwhile: never merge into it
            raise ValueError(f"{out} exists; choose a new folder for the resumed job")
        (scratch / out.name).rename(out)
        scratch.rmdir()
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break
        raise
