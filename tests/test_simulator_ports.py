"""The simulator's ports (feddg.flare.simulator.open_ports): drawn outside the kernel's ephemeral range, which every
outgoing connection and every bind to port 0 on the host draws from, so that nothing takes one between NVFlare's
check and its worker's bind without asking for it by number; each free when picked; NVFlare's picker otherwise."""

from __future__ import annotations

import socket

import pytest
from nvflare.private.fed.app.deployer import simulator_deployer
from nvflare.private.fed.app.simulator import simulator_runner

from feddg.flare import simulator
from feddg.flare.simulator import PORT_FLOOR, ephemeral_range, open_ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def test_the_ports_lie_outside_the_ephemeral_range_distinct_and_free():
    span = (32768, 60999)
    ports = open_ports(6, ephemeral=span)
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
        # the only candidates: the taken port and the one after it
        for _ in range(20):
            assert open_ports(1, ephemeral=(port + 2, 65535), floor=port, ceiling=65535) == [port + 1]


def test_nvflares_picker_where_no_such_port_is_free_or_the_range_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(simulator.network_utils, "get_open_ports", lambda n: ["nvflare's"] * n)
    assert open_ports(2, ephemeral=(PORT_FLOOR, 65535)) == ["nvflare's", "nvflare's"]
    monkeypatch.setattr(simulator, "EPHEMERAL_RANGE", tmp_path / "no_such_file")
    assert ephemeral_range() is None
    assert open_ports(1) == ["nvflare's"]


def test_the_kernels_range_is_read_where_the_host_has_one():
    span = ephemeral_range()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range on this host")
    low, high = span
    assert 1024 <= low <= high <= 65535
    assert all(not low <= p <= high for p in open_ports(3))


def test_the_simulator_module_makes_nvflare_pick_its_ports_with_it():
    """Where NVFlare's client runner (a site's worker) and its deployer (the server) look the picker up."""
    assert simulator_runner.get_open_ports is open_ports
    assert simulator_deployer.get_open_ports is open_ports
