"""NVFlare 2.9's simulator with two races closed: ``python -m feddg.flare.simulator JOB -w WORKSPACE [flags]`` takes
the flags of ``nvflare simulator`` and runs NVFlare's own runner (``nvflare.private.fed.app.simulator``); what it
changes is the name each site's worker process is given, and the ports it picks.

The name race (NVFlare 2.9.0, ``SimulatorClientRunner.do_one_task``): each of the simulator's ``-t`` threads starts a
site's worker process, waits for it to listen, then writes the site's name into the one ``build_ctx`` dict that all
the threads share, and sends that dict to its worker, which names its connection to the server after it. The threads
start together and poll their workers on the same one-second beat, so a second thread can write its name between
the first one's write and send: two workers then carry one site's name and no worker the other's. The server's log
shows the two evicting each other's connection ("evicted ... for exceeding limit 1") for as long as the run lasts;
the unnamed site's tasks are never fetched, so the run waits for a task timeout, stalls, or fails with too few
results. On a 2-core machine it took down three tests of one CI run (2026-11-29): a 6-site resumed GA job stalled
for 10 minutes after its last evaluation, a 4-site FedAvg job ended with 2 of its 3 training results
("Initialize ClientRunner for client: Domain3" in two workers, none for Domain2), and NVFlare's own 3-client FedAvg
recipe stalled the same way.

The fix: the runner's ``build_ctx`` keeps ``client_name`` per thread and is sent (pickled) as a plain dict holding
the sending thread's name, so every worker gets the name its own thread wrote.

The port race (``do_one_task`` and the simulator's deployer, ``get_open_ports``): a port is picked by binding port
0, freed, and bound again later by a site's worker (or the server). The kernel hands the same range of ports to
every outgoing connection and every other bind to port 0 on the host, and a run makes many of both, so one can take
the port in between: the worker fails with ``Address already in use`` and the simulator, connected to whatever now
listens there, waits for ever (forced on NVFlare's trivial job: the line 6 s in, the run still waiting when stopped at
120 s). A CI run (2026-11-29) hung 600 s in that trivial job; its log was not kept, and this is the cause found that
gives that hang.
The fix: the simulator's ports are drawn at random from those outside the kernel's ephemeral range
(:func:`open_ports`), which nothing takes without asking for that port by its number. The launcher still stops and
starts again a run that lost a port (:mod:`feddg.benchmark.launch`), for a host where no such port is free.

The crossing of two simulators (two runs at once on one host, as ``feddg benchmark --parallel 2`` runs them): each
draws its workers' ports from that same range, so two threads of two runs can draw one port. The worker that binds
it first takes the first thread's connection and closes its listener; the other worker, started a moment later,
then binds the freed port and takes the other thread's. Each run's worker is then named after a site of the other
run, and bound to its own run's server: each server sees two workers under one name (its log's "evicted ... for
exceeding limit 1") and none under the other. Seen on 2026-11-29: ``prostate_ga_BIDMC_seed5`` and
``prostate_ga_BMC_seed5`` started together; BIDMC's worker of the one and UCL's of the other swapped names, the first
run failed with too few results 55 s in, and the second would have waited for its task timeout. The fix: each draw
is claimed for :data:`PORT_HOLD_S` seconds in a file every simulator of the host reads (:data:`PORT_CLAIMS`, under
an exclusive ``flock``), and no other draw takes a claimed port; where the file cannot be opened (another user's,
no ``fcntl``), a draw goes on without it.

Nothing else changes: the same runner, flags, processes and messages. ``feddg simulate``, the recipes' ``--env sim``
and the benchmark's NVFlare anchors run the simulator through this module.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: draws are not claimed (the module docstring)
    fcntl = None  # type: ignore[assignment]

from nvflare.fuel.utils import network_utils
from nvflare.private.fed.app.deployer import simulator_deployer
from nvflare.private.fed.app.simulator import simulator_runner

CLIENT_NAME = "client_name"  # the key of build_ctx that do_one_task writes before sending it to a site's worker
# NVFlare's own class, also when this module is imported a second time (as ``__main__`` and by its name) after
# install() replaced it in NVFlare's module.
NVFLARE_CLIENT_RUNNER = getattr(simulator_runner.SimulatorClientRunner, "nvflare_runner",
                                simulator_runner.SimulatorClientRunner)


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux: the ports the kernel picks by itself
PORT_FLOOR = 20000  # below: the ports services are configured on (NVFlare's POC 8002-8003, Ray's workers 10002-19999)
PORT_TRIES = 200  # ports tried before falling back to NVFlare's own picker
# The host's claims on simulator ports: one "port expiry pid" line per draw still held (the module docstring).
PORT_CLAIMS = Path(tempfile.gettempdir()) / "feddg-simulator-ports"
# How long a drawn port stays claimed: from the draw to the worker's bind, which waits for the worker's interpreter
# to start (40-50 s measured with 12 site processes on 2 cores) and is bounded by NVFlare's 60 s connection timeout.
PORT_HOLD_S = 300.0


def ephemeral_range() -> tuple[int, int] | None:
    """The kernel's ephemeral port range ``(low, high)``, or None where it cannot be read (not Linux)."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


@contextmanager
def claimed_ports(claims: Path | None = PORT_CLAIMS, hold_s: float = PORT_HOLD_S) -> Iterator[set[int]]:
    """The ports claimed on this host and not yet expired, read from ``claims`` under an exclusive lock that is held
    until the block ends; ports the block adds to the set are written back, each claimed for ``hold_s`` seconds
    from now. Expired claims and unreadable lines are dropped. An empty set, kept nowhere, where ``claims`` is None
    or cannot be opened, or the platform has no ``fcntl``."""
    handle = None
    if claims is not None and fcntl is not None:
        try:
            handle = os.fdopen(os.open(claims, os.O_RDWR | os.O_CREAT, 0o666), "r+")
        except OSError:
            handle = None
    if handle is None:
        yield set()
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        now = time.time()
        held: dict[int, str] = {}
        for line in handle.read().splitlines():
            fields = line.split()
            try:
                if float(fields[1]) > now:
                    held[int(fields[0])] = line
            except (IndexError, ValueError):
                continue
        ports = set(held)
        yield ports
        for port in ports - set(held):
            held[port] = f"{port} {now + hold_s:.0f} {os.getpid()}"
        handle.seek(0)
        handle.truncate()
        handle.write("".join(f"{held[port]}\n" for port in sorted(held)))


def open_ports(number: int, ephemeral: tuple[int, int] | None = None, floor: int = PORT_FLOOR,
               ceiling: int = 65535, claims: Path | None = PORT_CLAIMS, hold_s: float = PORT_HOLD_S) -> list[int]:
    """``number`` distinct ports in ``[floor, ceiling]`` outside the ephemeral range (default: the kernel's), each free
    now (bound and released, as NVFlare's ``get_open_ports`` checks) and claimed by no other draw on this host
    (:func:`claimed_ports`; the draw claims them), in random order. NVFlare's own picker where the range is unknown
    or no such port is free."""
    span = ephemeral if ephemeral is not None else ephemeral_range()
    if span is None:
        return network_utils.get_open_ports(number)
    candidates = [p for p in range(floor, ceiling + 1) if not span[0] <= p <= span[1]]
    with claimed_ports(claims, hold_s) as claimed:
        ports: list[int] = []
        for port in random.SystemRandom().sample(candidates, min(PORT_TRIES, len(candidates))):
            if port in claimed:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
            ports.append(port)
            if len(ports) == number:
                claimed.update(ports)
                return ports
    return network_utils.get_open_ports(number)


class ThreadOwnClientName(dict):
    """A simulator runner's ``build_ctx`` whose ``client_name`` each thread writes and reads for itself, and which
    pickles (what ``multiprocessing``'s ``Connection.send`` does) to a plain dict with the pickling thread's name.

    Args:
        build_ctx: the context NVFlare's deployer built for the simulated clients (server and client config).
    """

    def __init__(self, build_ctx: dict[str, Any]) -> None:
        super().__init__(build_ctx)
        self._written = threading.local()

    def __setitem__(self, key: str, value: Any) -> None:
        if key == CLIENT_NAME:
            self._written.name = value
        super().__setitem__(key, value)

    def __getitem__(self, key: str) -> Any:
        if key == CLIENT_NAME and hasattr(self._written, "name"):
            return self._written.name
        return super().__getitem__(key)

    def for_this_thread(self) -> dict[str, Any]:
        """A plain copy, with the name this thread wrote (when it wrote one)."""
        plain = dict(self)
        if hasattr(self._written, "name"):
            plain[CLIENT_NAME] = self._written.name
        return plain

    def __reduce_ex__(self, protocol: Any) -> tuple[type, tuple[dict[str, Any]]]:
        return dict, (self.for_this_thread(),)


class SimulatorClientRunner(NVFLARE_CLIENT_RUNNER):
    """NVFlare's client runner of the simulator with its ``build_ctx`` made a :class:`ThreadOwnClientName`; the
    constructor's arguments are NVFlare's."""

    nvflare_runner = NVFLARE_CLIENT_RUNNER

    def __init__(self, server_custom_folder: str, args: argparse.Namespace, clients: list, client_config: Any,
                 deploy_args: Any, build_ctx: dict[str, Any]) -> None:
        super().__init__(server_custom_folder, args, clients, client_config, deploy_args,
                         ThreadOwnClientName(build_ctx) if type(build_ctx) is dict else build_ctx)


def install() -> None:
    """Make NVFlare's simulator build :class:`SimulatorClientRunner` and pick its ports with :func:`open_ports` in
    this process and in those it starts (``simulator_run_main`` looks the class up in its module when it runs; the
    runner and the deployer call ``get_open_ports`` from their modules). Idempotent."""
    simulator_runner.SimulatorClientRunner = SimulatorClientRunner
    simulator_runner.get_open_ports = open_ports
    simulator_deployer.get_open_ports = open_ports


# At import, not only in main(): where NVFlare starts its simulator process by spawning (macOS), that process imports
# this main module again (as ``__mp_main__``) without calling main(); on Linux it is forked and inherits it.
install()


def main(argv: list[str] | None = None) -> int:
    """``nvflare simulator``'s arguments and exit status, with :func:`install` in place."""
    from nvflare.private.fed.app.simulator.simulator import define_simulator_parser, run_simulator
    from nvflare.private.fed.app.utils import version_check

    if sys.platform == "darwin":  # as NVFlare's own simulator module does
        import multiprocessing

        multiprocessing.set_start_method("spawn")
    version_check()
    parser = argparse.ArgumentParser(prog="python -m feddg.flare.simulator")
    define_simulator_parser(parser)
    return run_simulator(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
