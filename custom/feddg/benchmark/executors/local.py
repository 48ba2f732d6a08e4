"""``--executor local`` (the default): the cells run in NVFlare's simulator on this host, ``--parallel N`` at once.

Each run is a :class:`~feddg.benchmark.launch.SimulatorRun` in a session of its own. The host's cores are split
between the runs through the thread budget (:mod:`feddg.compute`): every run is told that N runs share the host,
so each of its site processes counts every site process on the host. With several GPUs visible, run slot ``i``
uses GPU ``i mod G`` (``-gpu``; every site of the run on it); with none, the runs use the CPU. Each run's ports
are its own (the simulator takes free ports); a run that lost a port to another process is stopped as soon as its
log shows it and started once more (:meth:`~feddg.benchmark.launch.SimulatorRun.may_start_again`), and its record
counts the attempts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from feddg.benchmark.executors.base import INTERRUPTED, Cell, CellExecutor, ExecutorError, OnDone, Outcome, Report
from feddg.benchmark.launch import Ended, SimulatorRun
from feddg.benchmark.signals import STOP_SIGNALS
from feddg.compute import available_cores
from feddg.numerics import CPU_PIN_ENV, host_cpu

GPU_FLAG = "-gpu"


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--parallel", type=int, default=1, metavar="N",
                       help="local: N runs at once on this host, the cores split between them and, with several "
                            "GPUs, one GPU per run (default: 1; at most the host's cores)")


def from_args(args: argparse.Namespace) -> LocalExecutor:
    return LocalExecutor(parallel=args.parallel)


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPU ids this host's runs may use, as ``-gpu`` takes them: ``CUDA_VISIBLE_DEVICES``'s entries when it is
    set (NVFlare's site workers set it from ``-gpu``, so ids must be the host's own), else torch's device count."""
    environ = dict(os.environ) if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def gpu_of_slot(slot: int, gpus: Sequence[str], simulator_args: Sequence[str]) -> str | None:
    """The GPU of run slot ``slot``: ``gpus[slot mod len(gpus)]``; None without GPUs, or when the protocol's
    simulator flags choose the GPUs themselves (``-gpu``)."""
    if not gpus or GPU_FLAG in simulator_args or "--gpu" in simulator_args:
        return None
    return gpus[slot % len(gpus)]


@dataclass
class _Running:
    cell: Cell
    slot: int
    gpu: str | None
    sim: SimulatorRun
    rounds: int | None = None


class LocalExecutor(CellExecutor):
    """Simulator runs on this host, ``parallel`` at once (see the module docstring).

    Args:
        parallel: runs at once, 1 to the host's cores (:class:`ExecutorError` otherwise).
        gpus: the GPU ids to spread the runs over; None detects them (:func:`visible_gpus`), [] means the CPU.
        cores: the host's cores (default :func:`~feddg.compute.available_cores`).
    """

    name: ClassVar[str] = "local"
    runs_here: ClassVar[bool] = True

    def __init__(self, parallel: int = 1, gpus: Sequence[str] | None = None, cores: int | None = None) -> None:
        self.cores = available_cores() if cores is None else cores
        if parallel < 1:
            raise ExecutorError(f"--parallel {parallel}: give the number of runs at once, 1 or more")
        if parallel > self.cores:
            raise ExecutorError(f"--parallel {parallel}: more runs at once than this host's {self.cores} core(s); "
                                f"give at most {self.cores}")
        self.parallel = parallel
        self._gpus = None if gpus is None else list(gpus)
        self.host = socket.gethostname()

    @property
    def gpus(self) -> list[str]:
        if self._gpus is None:
            self._gpus = visible_gpus()
        return self._gpus

    def describe(self) -> str:
        gpus = f", GPU(s) {','.join(self.gpus)} one per run" if self.gpus and self.parallel > 1 else ""
        return f"{self.parallel} run(s) at once on {self.host} ({self.cores} cores{gpus})"

    def run_cells(self, cells: Sequence[Cell], on_done: OnDone, report: Report = print) -> None:
        from feddg.benchmark import launch  # its POLL_S and STOP_GRACE_S read at use (tests shorten the wait)

        pending, running = deque(cells), {}  # slot -> _Running
        try:
            while pending or running:
                signum = STOP_SIGNALS.received
                if signum is not None:
                    for slot in sorted(running):
                        r = running.pop(slot)  # a run ending by itself as the signal came keeps its end
                        ended = r.sim.poll(r.cell.timeout) or r.sim.ended_within(launch.STOP_GRACE_S) or r.sim.stop(
                            INTERRUPTED, f"stopped by {signal.Signals(signum).name} after {r.sim.wall_s:.0f} s")
                        on_done(r.cell, self._outcome(r, ended))
                    return
                for slot in range(self.parallel):
                    if slot not in running and pending:
                        running[slot] = self._start(pending.popleft(), slot)
                for slot in sorted(running):
                    r = running[slot]
                    ended = r.sim.poll(r.cell.timeout)
                    done = r.sim.rounds_done()
                    if done != r.rounds:
                        report(f"    {r.cell.run_id}: {done or 0}/{r.cell.rounds} rounds after {r.sim.wall_s:.0f} s")
                        r.rounds = done
                    if ended is None:
                        continue
                    if r.sim.may_start_again(ended):
                        report(f"    {r.cell.run_id}: {ended.reason}; running it again")
                        r.sim.start_again()
                        r.rounds = None
                        continue
                    del running[slot]
                    on_done(r.cell, self._outcome(r, ended))
                if running:
                    time.sleep(launch.POLL_S)
        finally:  # an exception on the way (not a signal): no run is left behind
            for r in running.values():
                r.sim.stop(INTERRUPTED, "the sweep ended")

    def _start(self, cell: Cell, slot: int) -> _Running:
        workspace = cell.folder / "ws"
        shutil.rmtree(workspace, ignore_errors=True)
        gpu = gpu_of_slot(slot, self.gpus, cell.simulator_args)
        sim = SimulatorRun(cell.job, workspace, cell.log, cell.simulator_args, gpu=gpu,
                           concurrent_runs=self.parallel, env={CPU_PIN_ENV: cell.cpu_pin}).start()
        return _Running(cell, slot, gpu, sim)

    def _outcome(self, r: _Running, ended: Ended) -> Outcome:
        where: dict[str, Any] = {"executor": self.name, "host": self.host, **host_cpu(),
                                 "parallel": self.parallel, "gpu": r.gpu,
                                 "attempts": r.sim.attempts}
        return Outcome(ended.status, ended.reason, ended.returncode, ended.wall_s, r.sim.server_dir, r.cell.log,
                       where, scratch=r.sim.workspace)
