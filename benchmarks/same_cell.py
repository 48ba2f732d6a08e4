"""One cell of a sweep run more than once (same task, method, held-out site, seed and protocol): are the runs the
same run, and how far apart is their held-out Dice when they are not. It tells a code change from a machine change:
the sweep's ``--reproduce-check`` compares a new code's run with a run of the folder, and a difference there may come
from either.

    python benchmarks/same_cell.py RUN_JSON RUN_JSON [RUN_JSON ...] --label NAME --label NAME ... --out DIR

Each RUN_JSON is a sweep's ``runs/<id>/run.json`` (the first is the reference); a run whose cell, config or
simulator flags differ from the reference's is refused, naming the first differing key. ``--label`` names where
each run was made, one per run (runs from before records kept their CPU model, ``executor.cpu``, do not say).
Writes ``same_cell.md`` and ``same_cell.json`` into ``--out``: per run its label, code fingerprint, held-out Dice
of the reported model (mean over structures, as the result tables show it), its difference to the reference, and
how many per-case scores differ from the reference's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feddg.benchmark.protocol import as_json, differences, first_difference
from feddg.benchmark.record import finished
from feddg.benchmark.scores import seed_dice
from feddg.benchmark.reproduce import case_scores_of
from feddg.folders import guard_folder


def compare(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """One row per record: label, code, held-out Dice, its difference to ``records[0]`` and the count of per-case
    scores that differ from ``records[0]``'s. ValueError when a record is not of the reference's cell and protocol,
    or did not finish."""
    if len(labels) != len(records):
        raise ValueError(f"{len(records)} runs but {len(labels)} labels: give one --label per run")
    reference = records[0]
    same = ("run", "config", "simulator_args")
    reference_scores = case_scores_of(reference["report"]) if finished([reference]) else {}
    rows = []
    for label, record in zip(labels, records):
        if not finished([record]):
            raise ValueError(f"{label}: the run did not finish (status {record.get('status')})")
        mismatch = first_difference(as_json({k: record.get(k) for k in same}),
                                    as_json({k: reference.get(k) for k in same}))
        if mismatch:
            raise ValueError(f"{label}: not the reference's cell and protocol: "
                             f"{mismatch.describe('in this run', 'in the reference')}")
        (dice,) = (per_seed[record["run"]["seed"]] for per_seed in seed_dice([record]).values())
        rows.append({"label": label, "run_id": record["run_id"], "code": record["code"], "dice": dice,
                     "differing_case_scores": sum(1 for _ in differences(reference_scores,
                                                                         case_scores_of(record["report"])))})
    total = _leaves(reference_scores)
    for row in rows:
        row["dice_minus_reference"] = row["dice"] - rows[0]["dice"]
        row["case_scores"] = total
    return rows


def _leaves(tree: Any) -> int:
    """The scores in a nested mapping of per-case scores (model -> site -> split -> case -> structure -> metric)."""
    return sum(_leaves(v) for v in tree.values()) if isinstance(tree, dict) else 1


def markdown(rows: Sequence[dict[str, Any]], command: str) -> str:
    lines = [f"# One cell run {len(rows)} times: `{rows[0]['run_id']}`", "", f"Made by `{command}`.", "",
             "| run | code | held-out Dice | minus the first | per-case scores differing from the first's |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['code'][:12]} | {r['dice']:.4f} | {r['dice_minus_reference']:+.4f} | "
              f"{r['differing_case_scores']} of {r['case_scores']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run.json files of one cell; the first is the reference")
    parser.add_argument("--label", action="append", required=True, help="where each run was made, one per run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/same_cell.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        args.out = guard_folder(args.out, "--out", whole=False)  # two files of its own, replaced by name
        rows = compare([json.loads(p.read_text()) for p in args.runs], args.label)
    except (OSError, ValueError, KeyError) as e:
        print(f"same_cell: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "same_cell.json").write_text(json.dumps({"runs": [str(p) for p in args.runs], "rows": rows},
                                                        indent=1) + "\n")
    (args.out / "same_cell.md").write_text(markdown(rows, command))
    print(markdown(rows, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
