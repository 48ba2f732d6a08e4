"""The simulator's ports (feddg.flare.simulator.open_ports): drawn outside the kernel's ephemeral range, which every
outgoing connection and every bind to port 0 on the host draws from, so that nothing takes one between NVFlare's
check and its worker's bind without asking for it by number; each free when picked and claimed by no other draw on
the host (two simulators at once drew one port and crossed their workers' names); NVFlare's picker otherwise."""

from __future__ import annotations

import multiprocessing
import socket
import time

import pytest
from nvflare.private.fed.app.deployer import simulator_deployer
from nvflare.private.fed.app.simulator import simulator_runner

from feddg.flare import simulator
from feddg.flare.simulator import PORT_FLOOR, claimed_ports, ephemeral_range, open_ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def test_the_ports_lie_outside_the_ephemeral_range_distinct_and_free(tmp_path):
    span = (32768, 60999)
    ports = open_ports(6, ephemeral=span, claims=tmp_path / "claims")
    assert len(set(ports)) == 6
    assert all(PORT_FLOOR <= p <= 65535 and not span[0] <= p <= span[1] for p in ports)
    assert all(_bindable(p) for p in ports)


def test_a_port_something_listens_on_is_never_picked():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        if not _bindable(port + 1):
            pytest.skip(f"port {port + 1} is in use on this host")
        # the only candidates: the taken port and the one after it (no claims: each draw may take it again)
        for _ in range(20):
            assert open_ports(1, ephemeral=(port + 2, 65535), floor=port, ceiling=65535, claims=None) == [port + 1]


def test_nvflares_picker_where_no_such_port_is_free_or_the_range_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(simulator.network_utils, "get_open_ports", lambda n: ["nvflare's"] * n)
    assert open_ports(2, ephemeral=(PORT_FLOOR, 65535), claims=tmp_path / "claims") == ["nvflare's", "nvflare's"]
    monkeypatch.setattr(simulator, "EPHEMERAL_RANGE", tmp_path / "no_such_file")
    assert ephemeral_range() is None
    assert open_ports(1, claims=tmp_path / "claims") == ["nvflare's"]


def test_the_kernels_range_is_read_where_the_host_has_one(tmp_path):
    span = ephemeral_range()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range on this host")
    low, high = span
    assert 1024 <= low <= high <= 65535
    assert all(not low <= p <= high for p in open_ports(3, claims=tmp_path / "claims"))


def _free_run(length: int) -> int:
    """The first of ``length`` consecutive ports outside the ephemeral range, each bindable now."""
    for base in range(PORT_FLOOR + 1000, 32768 - length, 97):
        if all(_bindable(base + i) for i in range(length)):
            return base
    pytest.skip(f"no {length} consecutive free ports on this host")


def test_a_claimed_port_is_not_drawn_again_until_its_claim_expires(tmp_path, monkeypatch):
    monkeypatch.setattr(simulator.network_utils, "get_open_ports", lambda n: ["nvflare's"] * n)
    base, claims = _free_run(2), tmp_path / "claims"
    two = {"ephemeral": (base + 2, 65535), "floor": base, "ceiling": 65535, "claims": claims}
    first, second = open_ports(1, **two), open_ports(1, **two)
    assert sorted(first + second) == [base, base + 1]
    assert open_ports(1, **two) == ["nvflare's"]  # both claimed: NVFlare's picker
    expiry, pid = claims.read_text().split("\n")[0].split()[1:]
    assert 290 < float(expiry) - time.time() < 301 and int(pid) == simulator.os.getpid()
    claims.write_text(f"{base} {time.time() - 1:.0f} 1\nnot a claim\n{base + 1} {time.time() + 60:.0f} 1\n")
    assert open_ports(1, **two) == [base]  # its claim expired; base + 1 still claimed
    assert [line.split()[0] for line in claims.read_text().splitlines()] == [str(base), str(base + 1)]


def _draw(kwargs: dict, start: multiprocessing.Barrier, out: multiprocessing.Queue) -> None:
    start.wait(30)
    out.put(open_ports(1, **kwargs)[0])


def test_processes_drawing_at_once_never_get_one_port(tmp_path):
    """Six simulators' draws at the same moment, from six ports: each gets its own (without claims, six draws of six
    ports share one in 98% of trials)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    context = multiprocessing.get_context("fork")
    base = _free_run(6)
    kwargs = {"ephemeral": (base + 6, 65535), "floor": base, "ceiling": 65535, "claims": tmp_path / "claims"}
    start, out = context.Barrier(6), context.Queue()
    procs = [context.Process(target=_draw, args=(kwargs, start, out)) for _ in range(6)]
    for proc in procs:
        proc.start()
    drawn = sorted(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(30)
    assert drawn == list(range(base, base + 6))


def test_without_a_claims_file_a_draw_goes_on_unclaimed(tmp_path):
    with claimed_ports(tmp_path) as claimed:  # a folder: cannot be opened as the file
        assert claimed == set()
        claimed.add(1)
    with claimed_ports(None) as claimed:
        assert claimed == set()
    assert len(open_ports(2, claims=tmp_path)) == 2


def test_the_simulator_module_makes_nvflare_pick_its_ports_with_it():
    """Where NVFlare's client runner (a site's worker) and its deployer (the server) look the picker up."""
    assert simulator_runner.get_open_ports is open_ports
    assert simulator_deployer.get_open_ports is open_ports
