"""The executor seam of the sweep: "run these cells and give back each one's outcome", wherever the compute is.

The sweep (:mod:`feddg.benchmark.sweep`) keeps planning, resume, the one-protocol rule, the record and the results;
an executor only runs cells. A :class:`Cell` is one run of the sweep with its rendered job folder; an
:class:`Outcome` is what came back: how it ended, its log, and a local folder holding the server's run files, from
which the sweep writes the run's ``run.json`` (the same fields for every executor, plus where it ran). An executor
never writes ``run.json``: a run an executor could not finish (a lost node, a stop signal) leaves no partial result.

Executors: ``local`` (simulator runs on this host, several at once), ``ray`` (each cell a Ray task on a cluster),
``flare`` (each cell a job in a provisioned NVFlare deployment). Each lives in its own module of this package and
declares its own command-line options (:mod:`feddg.benchmark.executors`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from feddg.benchmark.protocol import Run

OK, FAILED, TIMEOUT, INTERRUPTED = "ok", "failed", "timeout", "interrupted"
STATUSES = (OK, FAILED, TIMEOUT, INTERRUPTED)


@dataclass(frozen=True)
class Cell:
    """One run of the sweep, ready to run.

    Attributes:
        run: the cell (method, held-out site, seed; ``run.run_id`` names it).
        job: the rendered NVFlare job folder (``OUT/runs/<run id>/job``), the run's whole config.
        folder: ``OUT/runs/<run id>``: the executor writes the run's log here (:attr:`log`) and may use it as
            scratch space; the sweep writes ``run.json`` and the kept files here from the :class:`Outcome`.
        timeout: seconds the run may take, from its start (its time in a queue not counted).
        rounds: the run's ``train.rounds``, for progress lines.
        simulator_args: ``nvflare simulator`` flags of the protocol (local and ray executors).
        cpu_pin: the CPU numerics of the run's processes (:mod:`feddg.numerics`; local and ray executors: a
            deployment's sites run as their hosts are set up).
    """

    run: Run
    job: Path
    folder: Path
    timeout: float
    rounds: int
    simulator_args: tuple[str, ...] = ()
    cpu_pin: str = "off"

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def log(self) -> Path:
        """Where the executor writes the run's log: ``<folder>/simulate.log``."""
        return self.folder / "simulate.log"


@dataclass
class Outcome:
    """How one cell ended.

    Attributes:
        status: ``ok`` (ended by itself: the sweep then checks its exit code and report), ``failed`` (could not
            run, or ended with an error the executor saw), ``timeout`` or ``interrupted`` (a stop signal).
        reason: why, in words ("" for ``ok``).
        returncode: the exit code of the run's process (None when it has none, e.g. a deployment job).
        wall_s: seconds from the run's start to its end.
        server_dir: a local folder holding the server's run files (``feddg_report.json`` and the other files the
            sweep keeps, and below it the app folder with the final global model, :func:`final_model`), or None
            when there are none; the sweep copies what it keeps and then removes ``scratch``.
        log: the run's log, a local file.
        where: where it ran, recorded in ``run.json`` as ``executor``: ``{"executor": "local" | "ray" | "flare",
            ...}`` with e.g. ``"host"``, ``"node"`` or ``"sites"``, ``"gpu"``, and ``"attempts"`` (how many
            times it was started: NVFlare's port race starts a local run again, a lost node a Ray task; a Ray
            run's starts on its node, after a port race there, are its ``"simulator_starts"``).
        scratch: a local folder the sweep removes once it has kept what it needs (a simulator workspace with its
            models, a downloaded job result); None when there is none.
    """

    status: str
    reason: str
    returncode: int | None
    wall_s: float
    server_dir: Path | None
    log: Path
    where: dict[str, Any] = field(default_factory=dict)
    scratch: Path | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Outcome.status {self.status!r}: expected one of {STATUSES}")


def final_model(server: Path) -> Path | None:
    """The last global model the run's persistor saved (:data:`~feddg.flare.constants.GLOBAL_MODEL_FILE`, in the app
    folder below the server's run folder ``server``), the one nearest ``server``; None when there is none."""
    from feddg.flare.constants import GLOBAL_MODEL_FILE

    found = sorted(server.rglob(GLOBAL_MODEL_FILE), key=lambda p: len(p.parts)) if server.is_dir() else []
    return found[0] if found else None


class ExecutorError(ValueError):
    """An executor refused the sweep before any run started; the message is one line naming what is wrong (the
    option and its value, the address that does not answer, ...)."""


OnDone = Callable[[Cell, Outcome], None]
Report = Callable[[str], None]


class CellExecutor(abc.ABC):
    """Runs a sweep's cells. Subclasses set :attr:`name` and implement :meth:`check` and :meth:`run_cells`."""

    name: ClassVar[str]
    # Whether the runs read the protocol's data.root on this host (the sweep then checks the data here before any
    # run); False where the data stay elsewhere (the sites of a deployment each read their own).
    data_here: ClassVar[bool] = True
    # Whether the runs' processes get the cell's CPU numerics (Cell.cpu_pin); False where the sites run as their own
    # hosts are set up (a deployment): its runs are recorded unpinned.
    applies_cpu_pin: ClassVar[bool] = True
    # Whether the runs are made on this host's CPU (whose numbers family the sweep then knows before any run:
    # feddg.numerics.numbers_family); False where they run on other hosts.
    runs_here: ClassVar[bool] = False

    def check(self, cells: Sequence[Cell]) -> None:  # noqa: B027 - optional to override
        """Refuse the sweep before any run starts: :class:`ExecutorError` in one line (e.g. a cluster that does
        not answer, more runs at once than cores). Called once, with every cell to run, before the first."""

    @abc.abstractmethod
    def run_cells(self, cells: Sequence[Cell], on_done: OnDone, report: Report = print) -> None:
        """Run every cell (several at once where it can) and call ``on_done(cell, outcome)`` in the calling thread
        as each one ends, in the order they end; progress lines (``    <run id>: ...``) go to ``report``. On a stop signal (:data:`feddg.benchmark.signals.STOP_SIGNALS`'s
        ``received``; the caller defers signals while this runs) stop every cell started with everything it
        started, report each as ``interrupted``, start no other, and return; the sweep then raises
        :class:`~feddg.benchmark.signals.Interrupted`. A cell not started is not reported."""

    def describe(self) -> str:
        """One line for the plan: where the runs go (e.g. "2 runs at once on this host")."""
        return self.name
