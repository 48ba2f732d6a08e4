"""The drills' outcomes: what each one found, how a drill's own error becomes its failure (and never the others'),
and the record the command writes: ``drills.json`` (``{"drills": [{"name", "passed", "figures", "detail"}]}``) and
the Markdown table it prints and writes to ``drills.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feddg.flare.timings import server_rounds

DRILLS_FILE = "drills.json"
DRILLS_TABLE = "drills.md"


@dataclass
class DrillOutcome:
    """One drill's result: whether it passed, its measured figures (JSON values) and a one-line account."""

    name: str
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


# A drill that acts during the job is called as ``drill(r, job_id)`` and returns its check of the job's report
# (``feddg_report.json`` with the rounds' timings and the job's final status added), called once the job has ended.
Check = Callable[[dict], DrillOutcome]


def failed(name: str, detail: str) -> Check:
    """The check of a drill that could not act: it fails, saying why."""
    return lambda _report: DrillOutcome(name, False, {}, detail)


def judge(check: Check, name: str, report: dict) -> DrillOutcome:
    """A drill's check of the report; one that raises is that drill's failure, not the others'."""
    try:
        return check(report)
    except Exception as e:  # noqa: BLE001
        return DrillOutcome(name, False, {}, f"its check raised {type(e).__name__}: {e}")


def round_seconds(report: dict) -> list[float]:
    """Each round's wall time in the report's round timings (seconds, one decimal), in round order."""
    timings = server_rounds(report.get("round_timings") or [])
    return [round(t["ended"] - t["started"], 1) for t in timings]


def drills_table(outcomes: list[DrillOutcome]) -> str:
    """The drills as a Markdown table (what the command prints and writes to ``drills.md``)."""
    lines = ["| drill | result | what happened |", "|---|---|---|"]
    lines += [f"| {o.name} | {'passed' if o.passed else 'FAILED'} | {o.detail.replace('|', '/')} |"
              for o in outcomes]
    return "\n".join(lines) + "\n"


def write_outcomes(workspace: Path, outcomes: list[DrillOutcome]) -> None:
    """``drills.json`` and ``drills.md`` in ``workspace``, and the table on stdout."""
    (Path(workspace) / DRILLS_FILE).write_text(json.dumps({"drills": [asdict(o) for o in outcomes]}, indent=2))
    table = drills_table(outcomes)
    (Path(workspace) / DRILLS_TABLE).write_text(table)
    print(table, flush=True)
