"""A sweep executor that runs nothing: each cell "ends" at once with the status given, an ``ok`` one with a report
(per-case scores optional) in a server folder, so that the sweep's own record path writes every ``run.json``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from feddg.benchmark.executors.base import Cell, CellExecutor, OnDone, Outcome, Report


def scored_report(held_out: str, scores: Sequence[float]) -> dict:
    """A fundus report whose held-out site has one case per score (disc and cup Dice both the score)."""
    cases = {str(i): {"disc": {"dice": s}, "cup": {"dice": s}} for i, s in enumerate(scores)}
    test = {"disc": {"dice": {"mean": 0.7}}, "cup": {"dice": {"mean": 0.7}}, "cases": cases}
    return {"models": {"final": {"sites": {held_out: {"splits": {"test": test}}}}}}


class FakeExecutor(CellExecutor):
    """Records the run ids it was given in ``ran`` (with the results folder's name when ``with_folder``); its runs
    record ``cpu`` as the CPU they were made on, ``avx512`` as its flag and ``signature`` as its generation and
    caches (:func:`feddg.numerics.cpu_signature`), when given; ``scores``: every run's
    per-case scores, or method -> that method's; ``here``: it stands for an executor of this host; ``history``: the
    reports' rounds (``[{"round": 0, "sites": [...]}]``), none when not given."""

    name: ClassVar[str] = "fake"

    def __init__(self, ran: list, status: str = "ok", scores: Sequence[float] | dict[str, Sequence[float]] | None = None,
                 with_folder: bool = False, error: Exception | None = None, cpu: str | None = None,
                 avx512: bool | None = None, here: bool = False, history: list[dict] | None = None,
                 signature: str | None = None) -> None:
        self.ran, self.status, self.scores, self.with_folder, self.error = ran, status, scores, with_folder, error
        self.history = history
        self.where = {"executor": self.name, **({"cpu": cpu} if cpu else {}),
                      **({"avx512": avx512} if avx512 is not None else {}),
                      **({"cpu_signature": signature} if signature else {})}
        self.runs_here = here  # a stand-in for this host's executor: the sweep then knows its runs' CPU family

    def run_cells(self, cells: Sequence[Cell], on_done: OnDone, report: Report = print) -> None:
        for cell in cells:
            if self.error is not None:
                raise self.error
            self.ran.append((cell.run_id, cell.folder.parents[1].name) if self.with_folder else cell.run_id)
            server = cell.folder / "server"
            server.mkdir()
            scores = self.scores.get(cell.run.method) if isinstance(self.scores, dict) else self.scores
            report_json = scored_report(cell.run.held_out, scores if scores else ())
            if self.history is not None:
                report_json["history"] = self.history
            (server / "feddg_report.json").write_text(json.dumps(report_json))
            cell.log.write_text("")
            on_done(cell, Outcome(self.status, "" if self.status == "ok" else "it said so", 0, 1.0, server,
                                  cell.log, dict(self.where), scratch=server))
