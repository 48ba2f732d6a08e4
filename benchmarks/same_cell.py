"""One cell of a sweep run more than once (same task, method, held-out site, seed and protocol): are the runs the
same run, and how far apart is their held-out Dice when they are not. It tells a code change from a machine change:
the sweep's ``--reproduce-check`` compares a new code's run with a run of the folder, and a difference there may come
from either.

    python benchmarks/same_cell.py RUN_JSON RUN_JSON [RUN_JSON ...] --label NAME --label NAME ... --out DIR
    python benchmarks/same_cell.py ... --rounds 3     # runs of the cell's first 3 rounds: their training losses

Each RUN_JSON is a sweep's ``runs/<id>/run.json`` (the first is the reference); a run whose cell, config or
simulator flags differ from the reference's is refused, naming the first differing key. ``--label`` names where
each run was made, one per run (runs from before records kept their CPU model, ``executor.cpu``, do not say).
Writes ``same_cell.md`` and ``same_cell.json`` into ``--out``: per run its label, code fingerprint, held-out Dice
of the reported model (mean over structures, as the result tables show it), its difference to the reference, and
how many per-case scores differ from the reference's, and the first round whose sites' training losses differ
from the reference's. With ``--rounds N`` the runs after the first may be short ones, the cell's first N rounds
(``--set train.rounds=N``, the only setting allowed to differ): a few minutes that tell a machine from a code when
the short runs are made with both codes on one machine (a difference from the first round on that both share is the
machine's). Then only the training losses of those rounds are compared.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feddg.benchmark.protocol import as_json, differences, first_difference
from feddg.benchmark.record import check_record, finished
from feddg.benchmark.scores import seed_dice
from feddg.benchmark.reproduce import case_scores_of
from feddg.folders import guard_folder
from feddg.jsonfile import read_json_object, write_json
from feddg.report import script_command

SAME_CELL_FILE = "same_cell.json"  # the rows, which benchmarks/cpu_window.py reads


def first_loss_difference(reference: dict[str, Any], record: dict[str, Any], rounds: int | None = None) -> str | None:
    """The first round (of the first ``rounds``, else of those both ran) whose sites' training losses differ
    between the two runs' reports, with the first differing site and both losses; None when none differs.
    ValueError when a run holds fewer of those rounds than asked for."""
    theirs, ours = (r["report"].get("history", []) for r in (reference, record))
    n = min(len(theirs), len(ours)) if rounds is None else rounds
    if len(theirs) < n or len(ours) < n:
        raise ValueError(f"{record['run_id']}: {min(len(theirs), len(ours))} round(s) recorded, {n} to compare")
    for r in range(n):
        a, b = theirs[r].get("train_loss", {}), ours[r].get("train_loss", {})
        site = next((s for s in sorted(a.keys() | b.keys()) if a.get(s) != b.get(s)), None)
        if site is not None:
            return f"round {r}: {site} {a.get(site)!r} in the first, {b.get(site)!r} here"
    return None


def compare(records: Sequence[dict[str, Any]], labels: Sequence[str],
            rounds: int | None = None) -> list[dict[str, Any]]:
    """One row per record: label, code, held-out Dice, its difference to ``records[0]``, the count of per-case
    scores that differ from ``records[0]``'s and the first round whose training losses differ
    (:func:`first_loss_difference`). With ``rounds``, the runs after the first are the cell's first ``rounds``
    rounds (their ``train.rounds`` may differ, nothing else), and only those rounds' losses are compared (no Dice,
    no per-case scores). ValueError when a record is not of the reference's cell and protocol, or did not
    finish."""
    if len(labels) != len(records):
        raise ValueError(f"{len(records)} runs but {len(labels)} labels: give one --label per run")
    reference = records[0]
    same = ("run", "config", "simulator_args")
    reference_scores = case_scores_of(reference["report"]) if finished([reference]) else {}
    rows = []
    for label, record in zip(labels, records):
        if not finished([record]):
            raise ValueError(f"{label}: the run did not finish (status {record.get('status')})")
        cell = {k: record.get(k) for k in same}
        if rounds is not None:  # a short run of the cell: its rounds are the only setting allowed to differ
            cell["config"] = {**cell["config"], "train": {**cell["config"].get("train", {}),
                                                          "rounds": reference["config"]["train"]["rounds"]}}
        mismatch = first_difference(as_json(cell), as_json({k: reference.get(k) for k in same}))
        if mismatch:
            raise ValueError(f"{label}: not the reference's cell and protocol: "
                             f"{mismatch.describe('in this run', 'in the reference')}")
        row = {"label": label, "run_id": record["run_id"], "code": record["code"],
               "first_loss_difference": first_loss_difference(reference, record, rounds)}
        if rounds is None:
            (row["dice"],) = (per_seed[record["run"]["seed"]] for per_seed in seed_dice([record]).values())
            row["differing_case_scores"] = sum(1 for _ in differences(reference_scores,
                                                                      case_scores_of(record["report"])))
        rows.append(row)
    if rounds is not None:
        for row in rows:
            row["rounds_compared"] = rounds
        return rows
    total = _leaves(reference_scores)
    for row in rows:
        row["dice_minus_reference"] = row["dice"] - rows[0]["dice"]
        row["case_scores"] = total
    return rows


def _leaves(tree: Any) -> int:
    """The scores in a nested mapping of per-case scores (model -> site -> split -> case -> structure -> metric)."""
    return sum(_leaves(v) for v in tree.values()) if isinstance(tree, dict) else 1


def markdown(rows: Sequence[dict[str, Any]], command: str) -> str:
    lines = [f"# One cell run {len(rows)} times: `{rows[0]['run_id']}`", "", f"Made by `{command}`.", ""]
    if "rounds_compared" in rows[0]:
        lines += [f"The first {rows[0]['rounds_compared']} rounds' training losses of each site.", "",
                  "| run | code | first round whose training losses differ from the first's |", "|---|---|---|"]
        lines += [f"| {r['label']} | {r['code'][:12]} | {r['first_loss_difference'] or 'none'} |" for r in rows]
        return "\n".join(lines) + "\n"
    lines += ["| run | code | held-out Dice | minus the first | per-case scores differing from the first's | first "
              "round whose training losses differ |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['code'][:12]} | {r['dice']:.4f} | {r['dice_minus_reference']:+.4f} | "
              f"{r['differing_case_scores']} of {r['case_scores']} | {r['first_loss_difference'] or 'none'} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run.json files of one cell; the first is the reference")
    parser.add_argument("--label", action="append", required=True, help="where each run was made, one per run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=None,
                        help="the runs after the first are the cell's first N rounds: compare their losses only")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    command = script_command("benchmarks/same_cell.py", argv)
    try:
        args.out = guard_folder(args.out, "--out", whole=False)  # two files of its own, replaced by name
        rows = compare([check_record(p, read_json_object(p)) for p in args.runs], args.label, args.rounds)
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / SAME_CELL_FILE, {"runs": [str(p) for p in args.runs], "rows": rows}, indent=1,
                   finite=True)
    except (OSError, ValueError, KeyError) as e:
        print(f"same_cell: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    (args.out / "same_cell.md").write_text(markdown(rows, command))
    print(markdown(rows, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
