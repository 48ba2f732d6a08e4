"""How large each run's held-out predictions are against the reference masks: whether a method's final model
over- or under-segments the unseen site, and how much of its prediction lies on slices the site's annotators left
empty.

    python benchmarks/mask_volume.py benchmarks/results/loso_prostate_seeds [--held-out HK] [--control uniform]

Dice alone does not say which way a model errs. The synthetic sites differ in their labelling conventions by
construction (``feddg.data.synthetic.prostate``: margins of -1 to +1 px, apex and base slices left unlabelled at
some sites), so a method that weighs the training sites differently (GA) can move the unseen site's predictions
towards one convention; this script measures whether it did.

It needs the models, which the repository does not keep (only ``run.json``): a run's final global model
(``FL_global_model.pt``; the benchmark's reported model for every method but MLA-BIN, whose reported model is the
attention-combined one: for its runs this script measures the final global model, checked against that model's own
recorded per-case Dice) is read from beside its ``run.json``, where the sweep
keeps it on the machine that made the run (:func:`feddg.benchmark.executors.base.final_model`; code before that
kept none), or else from the run's workspace while that is still there. A model lives only on the machine that
made its run, so the measurement accumulates: a run whose model is not here keeps its row from the output's earlier
``mask_volume.json`` when its record still holds what that row was checked against (:func:`earlier_row`); runs
with neither are counted and left out. Each model is scored again here on the held-out site's test cases
(the run's own ``feddg.yaml``, from the checkpoint), and its per-case Dice is compared with the one its run recorded:
the largest absolute difference is printed per run, so a model that is not the run's (or numerics that differ)
shows.

Per test case and structure (:func:`case_volumes`): the predicted volume over the reference volume (``ratio``: 1 is
the right size; > 1 over-segments), split into the part on the slices where the reference has the structure
(``in_slices``) and the part on slices where it has none (``off_slices``). Per run: the means over the cases
(structures averaged). Per held-out site and method: the means over seeds, and the difference to ``--control`` with
the seed as the unit (:func:`feddg.benchmark.stats.compare_seeds` on the per-case ratios). Writes
``mask_volume.md`` and ``mask_volume.json`` into the folder (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feddg.benchmark.executors.base import final_model
from feddg.benchmark.stats import MIN_SEEDS
from feddg.jsonfile import read_json_object
from feddg.report import script_command

sys.path.insert(0, str(Path(__file__).resolve().parent))
from folder_report import number, report_folder, seed_difference, write_report  # noqa: E402

VOLUME_KEYS = ("ratio", "in_slices", "off_slices")
FINAL = "final"  # the report's name of the final global model, the model this script scores
REPORT = "mask_volume"  # the report's name: REPORT.md and REPORT.json (folder_report.write_report), read back too


def case_volumes(pred: np.ndarray, gt: np.ndarray) -> dict[str, float] | None:
    """The size of one structure's prediction against its reference in one evaluation unit.

    Args:
        pred: binary prediction, shape ``(H, W)`` (an image) or ``(H, W, D)`` (a volume, slices on the last axis).
        gt: binary reference, the same shape.

    Returns:
        ``{"ratio": |P| / |G|, "in_slices": |P on slices where G is present| / |G|, "off_slices": |P on slices
        where G is absent| / |G|}`` (``ratio = in_slices + off_slices``; an image is one slice), or None when the
        reference is empty (no size to compare with).
    """
    p, g = np.asarray(pred, dtype=bool), np.asarray(gt, dtype=bool)
    if p.shape != g.shape or p.ndim not in (2, 3):
        raise ValueError(f"expected two (H, W) or (H, W, D) masks of one shape, got {p.shape} and {g.shape}")
    reference = int(g.sum())
    if reference == 0:
        return None
    if p.ndim == 2:
        p, g = p[..., None], g[..., None]
    labelled = g.any(axis=(0, 1))  # (D,): the slices the reference has the structure on
    on = int(p[..., labelled].sum())
    off = int(p[..., ~labelled].sum())
    return {"ratio": (on + off) / reference, "in_slices": on / reference, "off_slices": off / reference}


def score_run(model_path: Path, held_out: str, recorded_dice: np.ndarray | None) -> dict[str, Any]:
    """The held-out test cases' volumes (structure means per case) and Dice of the model at ``model_path``, scored
    here with the run's stored configuration, and the largest per-case Dice difference to ``recorded_dice``."""
    import torch

    from feddg.data.dataset import load_site
    from feddg.evaluation import predict_logits, predicted_units
    from feddg.inference import read_checkpoint
    from feddg.metrics import case_metrics

    checkpoint = read_checkpoint(model_path)
    cfg = checkpoint.config
    test = load_site(cfg.data, held_out)["test"]
    logits = predict_logits(checkpoint.model, test.images, torch.device("cpu"), cfg.eval.batch_size)
    volumes: list[dict[str, float | None]] = []
    dice: list[float] = []
    for _, p, g, spacing in predicted_units(logits, test, cfg.eval.largest_component):  # the units the run scored
        metrics = case_metrics(p, g, spacing, distances=False)
        dice.append(float(np.mean([metrics[str(l)]["dice"] for l in range(p.shape[0])])))
        per_structure = [v for v in (case_volumes(p[l], g[l]) for l in range(p.shape[0])) if v is not None]
        volumes.append({k: float(np.mean([v[k] for v in per_structure])) if per_structure else None
                        for k in VOLUME_KEYS})
    dice_here = np.array(dice)
    if recorded_dice is None or len(recorded_dice) != len(dice_here):
        agreement = None
    else:
        agreement = float(np.max(np.abs(dice_here - recorded_dice)))
    return {"model": str(model_path), "cases": volumes, "dice": float(dice_here.mean()),
            "max_dice_difference": agreement, **{k: _mean_present(volumes, k) for k in VOLUME_KEYS}}


def _present(value: float | None) -> bool:
    """A measured volume: not None (this script's mark of a case without a reference) nor NaN (the mark in rows
    kept from files written before)."""
    return value is not None and bool(np.isfinite(value))


def _mean_present(items: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the cases (or runs) that have it (a case whose references are all empty has no
    volumes); None when none has it."""
    values = [c[key] for c in items if _present(c[key])]
    return float(np.mean(values)) if values else None


def earlier_row(row: Mapping[str, Any] | None, recorded_dice: np.ndarray | None) -> Mapping[str, Any] | None:
    """``row``, a run's row of an earlier measurement, when it still belongs to the run's record: its Dice (scored
    from the model then) is the mean of the record's per-case Dice within the largest per-case difference it was
    found to have (a run made again since, with other results, fails this); else None. A row that was never
    checked against a record (no ``max_dice_difference``) cannot be tied to it and is not kept."""
    if row is None or recorded_dice is None or len(recorded_dice) == 0 or row.get("max_dice_difference") is None:
        return None
    tolerance = float(row["max_dice_difference"]) + 1e-9
    return row if abs(float(row["dice"]) - float(np.mean(recorded_dice))) <= tolerance else None


def measure(folder: Path, held_out: Sequence[str] | None = None,
            earlier: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per finished run of ``folder`` whose model is on this machine, scored here (``scored_here``
    true), or else whose row in ``earlier`` (run id -> row of an earlier measurement) still belongs to its record
    (:func:`earlier_row`; ``scored_here`` false), in method, held-out site, seed order; and the run ids of the
    finished runs with neither."""
    from feddg.benchmark.record import run_records
    from feddg.benchmark.scores import case_dice

    earlier = earlier or {}
    rows, missing = [], []
    for run_id, record in sorted(run_records(folder, scores=True).items()):
        run = record.get("run") or {}
        if record.get("status") != "ok" or (held_out and run.get("held_out") not in held_out):
            continue
        model = final_model(folder / "runs" / run_id)  # the copy beside run.json before the workspace's
        if model is None:
            kept = earlier_row(earlier.get(run_id), case_dice(record, FINAL))
            if kept is None:
                missing.append(run_id)
            else:
                rows.append({**kept, "scored_here": False})
            continue
        rows.append({"run_id": run_id, "method": run["method"], "held_out": run["held_out"], "seed": int(run["seed"]),
                     **score_run(model, run["held_out"], case_dice(record, FINAL)), "scored_here": True})
    rows.sort(key=lambda r: (r["held_out"], r["method"], r["seed"]))
    return rows, missing


def _paired_ratios(ours: Sequence[Mapping[str, float | None]], theirs: Sequence[Mapping[str, float | None]]
                   ) -> tuple[list[float], list[float]]:
    """The two runs' per-case ratios, left out where a case has none (its reference is empty: the same cases for
    both, since both score the same test cases)."""
    kept = [(a["ratio"], b["ratio"]) for a, b in zip(ours, theirs, strict=True)
            if _present(a["ratio"]) and _present(b["ratio"])]
    return [a for a, _ in kept], [b for _, b in kept]


def summarise(rows: Sequence[dict[str, Any]], control: str) -> list[dict[str, Any]]:
    """Per held-out site and method: seeds, the means over seeds, and the paired difference of the ratio to
    ``control`` (seeds run for both; None without one)."""
    from feddg.benchmark.stats import compare_seeds

    by_cell: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault((r["held_out"], r["method"]), {})[r["seed"]] = r
    out = []
    for (site, method), runs in sorted(by_cell.items()):
        theirs = by_cell.get((site, control), {})
        paired = {k: _paired_ratios(runs[k]["cases"], theirs[k]["cases"]) for k in sorted(set(runs) & set(theirs))}
        difference = compare_seeds({site: paired}) if paired and method != control else None
        out.append({"held_out": site, "method": method, "seeds": sorted(runs),
                    **{k: _mean_present(list(runs.values()), k) for k in ("dice",) + VOLUME_KEYS},
                    "ratio_minus_control": None if difference is None else difference.to_dict()})
    return out


def _agreement(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def markdown(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], missing: Sequence[str],
             command: str, control: str) -> str:
    here = sum(bool(r["scored_here"]) for r in rows)
    lines = ["# How large the held-out predictions are", "",
             f"`{command}` (generated; each run's final global model scored again where it is kept).", "",
             "Ratio: predicted over reference volume per test case (1: the right size; above 1: over-segmented), "
             "the mean over the cases; in slices / off slices: the part of it on the slices where the reference has "
             "the structure / where it has none (slices the site's annotators left empty). Dice: scored again from "
             "the model; "
             "|Dice - recorded|: the largest per-case difference to the run's own record (0: the same model and "
             f"numerics). Ratio - {control}: paired by seed, the seed as the unit (95% crossed bootstrap interval "
             f"and paired t-test where {MIN_SEEDS} or more seeds are paired).", "",
             f"Runs: {len(rows)}, {here} scored on this machine and {len(rows) - here} kept from this file's earlier "
             "measurement (their models were on the machine that made them; their records unchanged since); "
             f"finished runs whose model is not on this machine and never scored (left out): {len(missing)}.",
             "", "## Per held-out site and method (means over seeds)", "",
             f"| held-out | method | seeds | Dice | ratio | in slices | off slices | ratio - {control} |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['held_out']} | {s['method']} | {', '.join(map(str, s['seeds']))} | {number(s['dice'])} | "
                     f"{number(s['ratio'])} | {number(s['in_slices'])} | {number(s['off_slices'])} | "
                     f"{seed_difference(s['ratio_minus_control'])} |")
    lines += ["", "## Per run", "", "| held-out | method | seed | Dice | ratio | in slices | off slices | "
              "|Dice - recorded| | scored |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['held_out']} | {r['method']} | {r['seed']} | {number(r['dice'])} | {number(r['ratio'])} | "
                     f"{number(r['in_slices'])} | {number(r['off_slices'])} | "
                     f"{_agreement(r['max_dice_difference'])} | {'here' if r['scored_here'] else 'earlier'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a feddg benchmark results folder")
    parser.add_argument("--held-out", help="comma-separated held-out sites to score (default: every one)")
    parser.add_argument("--control", default="uniform", help="the method of the ratio difference (default: uniform)")
    parser.add_argument("--out", type=Path, help="where to write mask_volume.md/.json (default: the folder)")
    args = parser.parse_args(argv)
    try:
        out = report_folder(args.folder, args.out)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    held_out = [s.strip() for s in args.held_out.split(",") if s.strip()] if args.held_out else None
    earlier_file = out / f"{REPORT}.json"
    try:  # an unreadable earlier measurement is named, not silently measured over
        previous = read_json_object(earlier_file).get("runs", []) if earlier_file.exists() else []
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    rows, missing = measure(args.folder, held_out,
                            {r["run_id"]: r for r in previous if isinstance(r, dict) and "run_id" in r})
    if not rows:
        print(f"{args.folder}: no finished run with its model on this machine or a row in {earlier_file} "
              f"({len(missing)} without)", file=sys.stderr)
        return 1
    summary = summarise(rows, args.control)
    command = script_command("benchmarks/mask_volume.py", argv)
    try:
        write_report(out, REPORT, markdown(rows, summary, missing, command, args.control),
                     {"command": command, "summary": summary, "runs": rows, "missing_models": list(missing)})
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
