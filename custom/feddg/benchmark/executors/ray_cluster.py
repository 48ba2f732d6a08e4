"""``--executor ray --ray-address ADDR``: each cell a Ray task on a cluster, declaring its CPUs and GPUs.

What goes over the wire, per attempt of a cell:

* to the worker: the job folder as a gzipped tar (bytes, a few hundred KiB), the simulator flags, the timeout;
* back: the run's end (status, reason, exit code, seconds, the simulator's starts: a run that lost NVFlare's port
  race on the node is started once more there, :func:`~feddg.benchmark.launch.run_simulator`), where it ran (node id, host, GPU), the ``feddg`` code
  fingerprint of the node, its log, every file of the server's run folder up to :data:`MAX_FILE_BYTES` (the report
  and the other files the sweep keeps) and the final global model
  (:func:`~feddg.benchmark.executors.base.final_model`, from its app folder); the best model and the sites' files
  are removed with the worker's scratch folder.

The worker runs the job with the shared launcher (:mod:`feddg.benchmark.launch`) in a scratch folder of its own
(under ``FEDDG_RAY_SCRATCH`` of the node's ``ray start`` environment, else the system's temporary folder),
telling the thread budget how many such runs its node holds at once (its CPUs / ``--cpus-per-run``), and with
``-gpu`` set to the GPU Ray gave the task. Every node needs ``feddg-flare`` installed (the same code: a node whose
code fingerprint differs from the driver's fails the cell, naming it) and, for real data, the data root at the same
path; synthetic data are generated on each node (``FEDDG_CACHE``).

A node or worker lost mid-run (a Ray system error, not the run's own failure) runs the cell again, on whichever
node Ray gives it, at most ``--max-retries`` times; ``run.json`` records every attempt. Nothing is written for a
cell until an attempt came back whole. A stop signal cancels every task (the worker stops its simulator with all its
processes) and reports the cells started as interrupted. Ray is optional (``pip install "feddg-flare[ray]"``) and
imported only when this executor runs.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import socket
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from feddg.benchmark.executors.base import (INTERRUPTED, Cell, CellExecutor, ExecutorError, OnDone, Outcome, Report,
                                            final_model)
from feddg.benchmark.signals import STOP_SIGNALS
from feddg.numbers import non_negative, positive

MAX_FILE_BYTES = 16 * 2**20  # server files larger than this stay on the worker (the final model is sent anyway)
CONNECT_TIMEOUT_S = 10.0  # how long the cluster's address may take to answer
CANCEL_WAIT_S = 40.0  # how long cancelled tasks may take to stop their simulators and come back
WAIT_S = 0.5  # how long the driver waits for a task to end between looks at signals
SCRATCH_ENV = "FEDDG_RAY_SCRATCH"  # where a node runs its cells (the environment of its `ray start`; default: TMPDIR)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--ray-address", metavar="ADDR",
                       help="ray: the cluster's head (HOST:PORT, or auto to join the cluster running on this machine)")
    group.add_argument("--cpus-per-run", type=positive, default=1.0, metavar="C",
                       help="ray: CPUs each run declares (default: 1); a node runs its CPUs / C runs at once")
    group.add_argument("--gpus-per-run", type=non_negative, default=0.0, metavar="G",
                       help="ray: GPUs each run declares (default: 0; 1 puts each run on a GPU of its own)")
    group.add_argument("--max-retries", type=int, default=2, metavar="N",
                       help="ray: times a run lost with its node is started again on another (default: 2)")


def from_args(args: argparse.Namespace) -> RayExecutor:
    if not args.ray_address:
        raise ExecutorError("--executor ray needs --ray-address: the cluster's head as HOST:PORT, or auto")
    return RayExecutor(args.ray_address, args.cpus_per_run, args.gpus_per_run, args.max_retries)


# ------------------------------------------------------------------------------------------- the worker's side


def pack(folder: Path, names: Sequence[str] | None = None) -> bytes:
    """``folder`` (or only the files ``names`` in it) as gzipped tar bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in names if names is not None else ["."]:
            tar.add(folder / name, arcname=name)
    return buffer.getvalue()


def unpack(data: bytes, into: Path) -> None:
    """Extract tar bytes from :func:`pack` into ``into`` (no path may leave it)."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")


def run_cell_on_worker(job_tar: bytes, job_name: str, simulator_args: Sequence[str], timeout: float,
                       cpus_per_run: float, cpu_pin: str = "off") -> dict[str, Any]:
    """The Ray task: run one job in the simulator on this node and return its end, its log and server files (see
    the module docstring). A cancelled task (KeyboardInterrupt from Ray) stops its simulator before it ends."""
    import ray

    from feddg.benchmark.launch import SimulatorRun, run_simulator
    from feddg.numerics import CPU_PIN_ENV, host_cpu
    from feddg.report import code_fingerprint

    context = ray.get_runtime_context()
    node_id = context.get_node_id()
    node_cpus = next((n["Resources"].get("CPU", 1.0) for n in ray.nodes() if n["NodeID"] == node_id), 1.0)
    gpus = [str(g) for g in ray.get_gpu_ids()]
    scratch = Path(tempfile.mkdtemp(prefix="feddg-ray-cell-", dir=os.environ.get(SCRATCH_ENV) or None))
    try:
        unpack(job_tar, scratch / "job")
        run = SimulatorRun(scratch / "job" / job_name, scratch / "ws", scratch / "simulate.log", simulator_args,
                           gpu=",".join(gpus) if gpus else None,
                           concurrent_runs=max(1, int(node_cpus // max(cpus_per_run, 1e-9))),
                           env={CPU_PIN_ENV: cpu_pin})
        ended = run_simulator(run, timeout)
        server = run.server_dir
        files = sorted(p.name for p in server.iterdir() if p.is_file() and p.stat().st_size <= MAX_FILE_BYTES) \
            if server.is_dir() else []
        model = final_model(server)
        if model is not None:
            files.append(model.relative_to(server).as_posix())
        return {"status": ended.status, "reason": ended.reason, "returncode": ended.returncode,
                "wall_s": ended.wall_s, "simulator_starts": ended.attempts,
                "node": {"node_id": node_id, "host": socket.gethostname(), **host_cpu(),
                         "ip": ray.util.get_node_ip_address(), "gpus": gpus},
                "code": code_fingerprint(), "log": run.log.read_bytes() if run.log.exists() else b"",
                "server_files": pack(server, files) if files else b""}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------------------------- the driver's side


@dataclass
class _Task:
    cell: Cell
    ref: Any  # ray.ObjectRef
    lost: list[dict[str, Any]] = field(default_factory=list)  # the attempts lost with their node or worker
    submitted: float = field(default_factory=time.perf_counter)


class RayExecutor(CellExecutor):
    """Cells as Ray tasks (see the module docstring).

    Args:
        address: the cluster's head, ``HOST:PORT`` (its GCS port, ``ray start --head --port``), or ``auto``.
        cpus_per_run: CPUs each task declares (> 0).
        gpus_per_run: GPUs each task declares (>= 0).
        max_retries: times a cell lost with its node is started again (>= 0).
    """

    name: ClassVar[str] = "ray"

    def __init__(self, address: str, cpus_per_run: float = 1.0, gpus_per_run: float = 0.0,
                 max_retries: int = 2) -> None:
        if not cpus_per_run > 0:
            raise ExecutorError(f"--cpus-per-run {cpus_per_run:g}: give a positive number of CPUs")
        if gpus_per_run < 0:
            raise ExecutorError(f"--gpus-per-run {gpus_per_run:g}: give 0 or more GPUs")
        if max_retries < 0:
            raise ExecutorError(f"--max-retries {max_retries}: give 0 or more")
        self.address, self.cpus_per_run, self.gpus_per_run = address, cpus_per_run, gpus_per_run
        self.max_retries = max_retries
        self._connected = False
        self._task: Any = None  # the Ray remote function, made once connected

    def describe(self) -> str:
        return (f"Ray cluster at {self.address}, {self.cpus_per_run:g} CPU(s) and {self.gpus_per_run:g} GPU(s) per "
                f"run, a run lost with its node started again at most {self.max_retries} time(s)")

    def check(self, cells: Sequence[Cell]) -> None:
        """Refuse in one line: Ray not installed, a cluster that does not answer, simulator flags choosing GPUs
        (Ray gives each run its own), or no node with the CPUs and GPUs a run declares (it would wait forever)."""
        if any(flag in cell.simulator_args for cell in cells for flag in ("-gpu", "--gpu")):
            raise ExecutorError("--executor ray gives each run its GPUs (--gpus-per-run): leave -gpu out of the "
                                "simulator flags")
        ray = self._connect()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        fits = [n for n in nodes if n["Resources"].get("CPU", 0) >= self.cpus_per_run
                and n["Resources"].get("GPU", 0) >= self.gpus_per_run]
        if not fits:
            have = ", ".join(f"{n['NodeManagerAddress']}: {n['Resources'].get('CPU', 0):g} CPU "
                             f"{n['Resources'].get('GPU', 0):g} GPU" for n in nodes) or "no node"
            raise ExecutorError(f"--ray-address {self.address}: no node has the {self.cpus_per_run:g} CPU(s) and "
                                f"{self.gpus_per_run:g} GPU(s) a run declares ({have})")

    def _connect(self) -> Any:
        try:
            import ray
        except ModuleNotFoundError:
            raise ExecutorError('--executor ray needs Ray: pip install "feddg-flare[ray]"') from None
        if self._connected or ray.is_initialized():  # a caller already connected (a notebook, a test) keeps it
            self._connected = True
            return ray
        if self.address != "auto":
            host, _, port = self.address.rpartition(":")
            try:
                socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
            except (OSError, ValueError) as e:
                raise ExecutorError(f"--ray-address {self.address}: does not answer ({e}); give the head's "
                                    f"HOST:PORT as ray start --head printed it, or auto") from None
        try:
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ExecutorError(f"--ray-address {self.address}: no Ray cluster there "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        self._connected = True
        return ray

    def _submit(self, cell: Cell) -> Any:
        """Start one attempt of ``cell``; Ray itself never retries it (``max_retries=0``): this executor does,
        counting the attempts."""
        ray = self._connect()
        if self._task is None:
            self._task = ray.remote(run_cell_on_worker)
        task = self._task.options(num_cpus=self.cpus_per_run, num_gpus=self.gpus_per_run, max_retries=0,
                                  name=cell.run_id)
        return task.remote(pack(cell.job.parent, [cell.job.name]), cell.job.name, list(cell.simulator_args),
                           cell.timeout, self.cpus_per_run, cell.cpu_pin)

    def run_cells(self, cells: Sequence[Cell], on_done: OnDone, report: Report = print) -> None:
        ray = self._connect()
        tasks = {}  # ObjectRef -> _Task
        for cell in cells:
            ref = self._submit(cell)
            tasks[ref] = _Task(cell, ref)
        try:
            while tasks:
                signum = STOP_SIGNALS.received
                if signum is not None:
                    self._cancel(tasks, signal.Signals(signum).name, on_done)
                    return
                ready, _ = ray.wait(list(tasks), num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    task = tasks.pop(ref)
                    result, error = self._result(ref)
                    if error is not None and len(task.lost) < self.max_retries:
                        task.lost.append({"error": error, "after_s": round(time.perf_counter() - task.submitted, 1)})
                        report(f"    {task.cell.run_id}: lost ({error}); starting it again "
                               f"(attempt {len(task.lost) + 1} of at most {self.max_retries + 1})")
                        retried = _Task(task.cell, self._submit(task.cell), task.lost)
                        tasks[retried.ref] = retried
                        continue
                    if error is not None:
                        task.lost.append({"error": error})
                    on_done(task.cell, self._outcome(task, result))
        finally:
            for ref in tasks:  # an exception on the way: no task is left running
                ray.cancel(ref, force=True)

    def _result(self, ref: Any) -> tuple[dict[str, Any] | None, str | None]:
        """(the task's result, None), or (None, the system error that lost it: its node or worker died)."""
        import ray

        try:
            return ray.get(ref, timeout=CANCEL_WAIT_S), None
        except ray.exceptions.RayTaskError:
            raise  # the task's own code failed: a bug, not a lost node
        except ray.exceptions.RayError as e:
            return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")

    def _cancel(self, tasks: dict[Any, _Task], signame: str, on_done: OnDone) -> None:
        """Cancel every task (the workers stop their simulators), wait for them, and report each as interrupted."""
        import ray

        for ref in tasks:
            ray.cancel(ref)  # KeyboardInterrupt in the task: run_simulator stops the simulator on its way out
        ray.wait(list(tasks), num_returns=len(tasks), timeout=CANCEL_WAIT_S)
        for ref, task in tasks.items():
            ray.cancel(ref, force=True)  # one that did not stop in time
            where = {"executor": self.name, "address": self.address, "attempts": len(task.lost) + 1,
                     "lost": task.lost}
            on_done(task.cell, Outcome(INTERRUPTED, f"stopped by {signame} after "
                                                    f"{time.perf_counter() - task.submitted:.0f} s (cancelled)",
                                       None, time.perf_counter() - task.submitted, None, task.cell.log, where))
        tasks.clear()

    def _outcome(self, task: _Task, result: dict[str, Any] | None) -> Outcome:
        """The cell's outcome from the worker's result: its log and server files unpacked into the cell's folder;
        ``failed`` when every attempt was lost or the node runs other code."""
        from feddg.report import code_fingerprint

        cell = task.cell
        where: dict[str, Any] = {"executor": self.name, "address": self.address, "attempts": len(task.lost) + 1,
                                 "lost": task.lost}
        if result is None:
            cell.log.write_text(f"every attempt was lost: {task.lost}\n")
            return Outcome("failed", f"lost with its node or worker {len(task.lost)} time(s) (--max-retries "
                                     f"{self.max_retries}): {task.lost[-1]['error']}", None,
                           time.perf_counter() - task.submitted, None, cell.log, where)
        where.update(node=result["node"]["host"], node_ip=result["node"]["ip"], node_id=result["node"]["node_id"],
                     cpu=result["node"].get("cpu"), avx512=result["node"].get("avx512"),
                     cpu_signature=result["node"].get("cpu_signature"), gpu=",".join(result["node"]["gpus"]) or None,
                     simulator_starts=result.get("simulator_starts", 1))
        cell.log.write_bytes(result["log"])
        server = cell.folder / "server_files"
        if result["server_files"]:
            unpack(result["server_files"], server)
        status, reason = result["status"], result["reason"]
        if result["code"] != code_fingerprint():
            status, reason = "failed", (f"node {result['node']['host']} runs other feddg code "
                                        f"({str(result['code'])[:12]}, this driver {code_fingerprint()[:12]}): "
                                        f"install the same version on every node")
        return Outcome(status, reason, result["returncode"], result["wall_s"],
                       server if server.is_dir() else None, cell.log, where, scratch=server)
