"""A test network on one machine: a network namespace per participant, all on one bridge, and nothing else.

    net = RehearsalNetwork.plan(["feddg-server.rehearsal.test", "BIDMC", "BMC", "admins"], server="feddg-server...")
    net.create()          # refuses when the address range collides with a route of the machine
    net.verify_isolated() # before anything starts: no uplink, no host address, no default route, no NAT
    ...  net.command("BMC", [...]) runs a command inside BMC's stack; net.link("BMC", up=False) cuts its link
    net.teardown()

Every participant gets a namespace of its own (``ip netns add``) with one veth whose other end is a port of one
bridge; the bridge has no other port (no uplink) and no address on the host's own stack, and the namespaces have
one route, to the test subnet, so a packet for any other address fails inside the namespace (``Network is
unreachable``) before it is sent. IPv6 is switched off in the namespaces and on the bridge (no link-local
chatter). The server's fully qualified name resolves only inside the namespaces: each gets a hosts file
(``/etc/netns/<ns>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``), the machine's own is untouched.

The addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for benchmark networks (never routed on the
internet); the subnet must lie inside it and collide with no route or address of the machine. A drill's fault is a
link going down and up (``ip link set DEV down|up`` on the participant's bridge port): this machine has no
``tc netem``.

What was made is written to ``network.json`` in the workspace first, so that a run that died leaves nothing a
later :meth:`RehearsalNetwork.teardown` (or the next run on the same workspace) cannot remove. Needs root and
iproute2's ``ip``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from feddg.process_tree import alive

REHEARSAL_RANGE = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544: benchmark networks only
DEFAULT_SUBNET = "198.18.0.0/24"
STATE_FILE = "network.json"
NETNS_ETC = Path("/etc/netns")
# Every network made on this host is also recorded here (on tmpfs: gone at reboot, as the namespaces are), so that
# one whose rehearsal was killed before its teardown (SIGKILL, a test runner stopped) is removed by the next network
# made on the host, whatever workspace either used.
REGISTRY = Path("/run/feddg-rehearsal")


class NetworkError(RuntimeError):
    """The test network cannot be made or is not isolated; the message says what and where."""


@dataclass(frozen=True)
class Host:
    """One participant's network stack."""

    name: str  # the participant ("feddg-server.rehearsal.test", "BIDMC", "admins")
    namespace: str  # its network namespace
    address: str  # its address on the test subnet
    port: str  # its veth end on the bridge (host side): a drill cuts the link here


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # bits of the effective capability set (linux/capability.h)


def missing_privileges() -> list[str]:
    """What this process lacks to make a test network: iproute2's ``ip``, CAP_NET_ADMIN (links, addresses) and
    CAP_SYS_ADMIN (``ip netns add`` mounts the namespace); empty when it can."""
    missing = [] if shutil.which("ip") else ["iproute2's `ip` command (install iproute2)"]
    try:
        status = Path("/proc/self/status").read_text()
        effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        effective = 0
    for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN)):
        if not effective >> bit & 1:
            missing.append(f"{name} (run as root)")
    return missing


def reap_orphans() -> list[str]:
    """Remove every network recorded in :data:`REGISTRY` whose rehearsal process has ended without tearing it down
    (its namespaces, ports, bridge and whatever still runs inside); returns the bridges removed. A network whose
    rehearsal still runs is left alone."""
    removed = []
    for record in sorted(REGISTRY.glob("*.json")):
        try:
            net = RehearsalNetwork._load(record)
        except (ValueError, TypeError, KeyError):  # unreadable: nothing can be torn down from it
            record.unlink(missing_ok=True)
            continue
        if net is not None and not net.owner_alive() and net.owner != os.getpid() and not net.teardown():
            removed.append(net.bridge)
    return removed


def require_privileges() -> None:
    missing = missing_privileges()
    if missing:
        raise NetworkError(f"the network rehearsal needs {' and '.join(missing)}; nothing was created")


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _ip_json(*args: str) -> list[dict]:
    out = _ip("-j", *args)
    return json.loads(out) if out.strip() else []


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32] or "host"


def collisions(subnet: ipaddress.IPv4Network) -> list[str]:
    """The machine's routes (every table) and addresses whose prefix overlaps ``subnet``; default routes excepted
    (they overlap everything and make no address ambiguous)."""
    found = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("type") == "broadcast":
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.overlaps(subnet):
            found.append(f"route {dst} dev {route.get('dev', '?')} (table {route.get('table', 'main')})")
    for link in _ip_json("-4", "addr"):
        for info in link.get("addr_info", []):
            net = ipaddress.ip_network(f"{info['local']}/{info.get('prefixlen', 32)}", strict=False)
            if net.overlaps(subnet):
                found.append(f"address {info['local']}/{info.get('prefixlen')} on {link.get('ifname')}")
    return found


def check_subnet(subnet: str) -> ipaddress.IPv4Network:
    """The subnet as a network, or NetworkError: outside 198.18.0.0/15, too small, or colliding with a route."""
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as e:
        raise NetworkError(f"subnet {subnet!r}: {e}") from None
    if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(REHEARSAL_RANGE):
        raise NetworkError(f"subnet {subnet}: the test hosts' addresses must lie in {REHEARSAL_RANGE} (RFC 2544 "
                           f"benchmark range), so that the rehearsal can never address a real network")
    clashes = collisions(net)
    if clashes:
        raise NetworkError(f"subnet {subnet} collides with this machine's {', '.join(clashes)}; choose another "
                           f"subnet inside {REHEARSAL_RANGE} (--subnet)")
    return net


@dataclass
class RehearsalNetwork:
    """The namespaces, veths and bridge of one rehearsal (see the module docstring)."""

    bridge: str
    subnet: str
    server: str  # the server's fully qualified name, resolvable in every namespace of this network
    hosts: dict[str, Host]
    workspace: str
    owner: int = field(default_factory=os.getpid)  # the process of the rehearsal that made this network
    owner_started: float = field(default_factory=lambda: psutil.Process().create_time())  # tells a reused pid

    @classmethod
    def plan(cls, participants: list[str], server: str, workspace: Path, subnet: str = DEFAULT_SUBNET,
             tag: str | None = None) -> RehearsalNetwork:
        """Names and addresses for ``participants`` (the server's name among them); nothing is made yet."""
        if server not in participants:
            raise NetworkError(f"the server {server!r} is not among the participants {participants}")
        if len(set(participants)) != len(participants):
            raise NetworkError(f"participant names repeat: {participants}")
        net = ipaddress.ip_network(subnet)
        addresses = list(net.hosts())
        if len(participants) > len(addresses):
            raise NetworkError(f"subnet {subnet} has {len(addresses)} addresses for {len(participants)} hosts")
        tag = tag or secrets.token_hex(2)  # interface names are at most 15 characters: fdg<tag><n>
        hosts = {name: Host(name, f"feddg-{tag}-{_slug(name)}", str(addresses[i]), f"fdg{tag}p{i}")
                 for i, name in enumerate(participants)}
        return cls(f"fdg{tag}br", str(net), server, hosts, str(Path(workspace).resolve()))

    # ------------------------------------------------------------------ making and unmaking
    def create(self) -> None:
        """Make the bridge, one namespace per participant and its hosts file. The subnet is checked first; what is
        made is recorded in ``network.json`` before it is made."""
        require_privileges()
        reap_orphans()
        check_subnet(self.subnet)
        Path(self.workspace).mkdir(parents=True, exist_ok=True)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        for record in (Path(self.workspace, STATE_FILE), REGISTRY / f"{self.bridge}.json"):
            record.write_text(json.dumps(asdict(self), indent=2))
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        _write_if_present(f"/proc/sys/net/ipv6/conf/{self.bridge}/disable_ipv6", "1")
        _ip("link", "set", self.bridge, "up")
        server_address = self.hosts[self.server].address
        for host in self.hosts.values():
            _ip("netns", "add", host.namespace)
            self.command(host.name, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"],
                         check=False)
            _ip("link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            _write_if_present(f"/proc/sys/net/ipv6/conf/{host.port}/disable_ipv6", "1")
            _ip("link", "set", host.port, "master", self.bridge, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/{prefix}", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            etc = NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{server_address} {self.server}\n"
                                       f"{host.address} {_slug(host.name)}.rehearsal.test\n")

    def processes(self) -> dict[str, list[int]]:
        """The processes running inside this network's namespaces (``ip netns pids``), by namespace: whatever
        runs there was started by the rehearsal that made it."""
        found = {}
        for host in self.hosts.values():
            if Path("/run/netns", host.namespace).exists():
                pids = [int(p) for p in _ip("netns", "pids", host.namespace, check=False).split()]
                if pids:
                    found[host.namespace] = pids
        return found

    def owner_alive(self) -> bool:
        """Whether the rehearsal that made this network still runs (then its workspace is in use)."""
        if self.owner == os.getpid() or self.owner <= 0:  # an earlier, finished rehearsal of this process
            return False
        try:
            return psutil.Process(self.owner).create_time() == self.owner_started
        except psutil.NoSuchProcess:
            return False

    def stop_processes(self, timeout: float = 10.0) -> None:
        """SIGTERM every process inside this network's namespaces, then SIGKILL what is left after ``timeout``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [pid for group in self.processes().values() for pid in group]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + timeout
            while pids and time.monotonic() < deadline:
                pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and alive(pid)]
                time.sleep(0.2)
            if not pids:
                return

    def teardown(self) -> list[str]:
        """Stop what runs in its namespaces, then remove everything this network made (missing pieces are fine);
        returns what could not be removed."""
        self.stop_processes()
        left = []
        for host in self.hosts.values():
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.port, check=False)
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
            if Path("/run/netns", host.namespace).exists():
                left.append(f"namespace {host.namespace}")
        _ip("link", "del", self.bridge, check=False)
        if _ip("link", "show", self.bridge, check=False).strip():
            left.append(f"bridge {self.bridge}")
        if not left:
            (REGISTRY / f"{self.bridge}.json").unlink(missing_ok=True)
        return left

    @classmethod
    def leftover(cls, workspace: Path) -> RehearsalNetwork | None:
        """The network a previous run on ``workspace`` recorded, if any (to tear it down)."""
        return cls._load(Path(workspace, STATE_FILE))

    @classmethod
    def _load(cls, state: Path) -> RehearsalNetwork | None:
        """The network recorded in ``state`` (a workspace's ``network.json`` or a :data:`REGISTRY` record)."""
        if not state.is_file():
            return None
        data = json.loads(state.read_text())
        data["hosts"] = {k: Host(**v) for k, v in data["hosts"].items()}
        data.setdefault("owner", -1)  # recorded by an earlier release without it: no owner to ask
        data.setdefault("owner_started", 0.0)
        return cls(**data)

    # ------------------------------------------------------------------ using it
    def command(self, name: str, cmd: list[str], check: bool = True, timeout: float = 60
                ) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside ``name``'s network stack and wait for it (at most ``timeout`` s)."""
        proc = subprocess.run(self.prefix(name) + cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise NetworkError(f"in {name}'s namespace, `{' '.join(cmd)}` failed: {proc.stderr.strip()}")
        return proc

    def prefix(self, name: str) -> list[str]:
        """The argv prefix that runs a program inside ``name``'s network stack."""
        return ["ip", "netns", "exec", self.hosts[name].namespace]

    def link(self, name: str, up: bool) -> None:
        """Bring ``name``'s link up or down (its bridge port)."""
        _ip("link", "set", self.hosts[name].port, "up" if up else "down")

    def can_reach(self, source: str, target: str, port: int, timeout: float = 2.0) -> bool:
        """Whether a TCP connection from ``source``'s stack to ``target``'s address and ``port`` is accepted. Only
        addresses of this network are ever tried."""
        address = self.hosts[target].address
        probe = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), "
                 "timeout=float(sys.argv[3])).close()\nexcept OSError:\n sys.exit(1)\n")
        proc = subprocess.run(self.prefix(source) + ["python3", "-c", probe, address, str(port), str(timeout)],
                              capture_output=True, timeout=timeout + 30)
        return proc.returncode == 0

    # ------------------------------------------------------------------ the isolation check
    def isolation_problems(self) -> list[str]:
        """Everything that would let a packet leave the test network; empty when isolated."""
        problems = []
        subnet = ipaddress.ip_network(self.subnet)
        bridge = _ip_json("addr", "show", "dev", self.bridge)
        if bridge and bridge[0].get("addr_info"):
            problems.append(f"bridge {self.bridge} has an address on the host's stack: "
                            f"{[a['local'] for a in bridge[0]['addr_info']]}")
        ports = {link["ifname"] for link in _ip_json("link", "show", "master", self.bridge)}
        ours = {h.port for h in self.hosts.values()}
        if ports - ours:
            problems.append(f"bridge {self.bridge} has ports that are not this network's: {sorted(ports - ours)}")
        for host in self.hosts.values():
            for family in ("-4", "-6"):
                out = self.command(host.name, ["ip", "-j", family, "route", "show", "table", "all"]).stdout
                for route in json.loads(out) if out.strip() else []:
                    dst, kind = route.get("dst", ""), route.get("type", "unicast")
                    if dst == "default":
                        problems.append(f"{host.name}: a default route via {route.get('gateway', '?')}")
                    elif family == "-6" and route.get("dev") != "lo":
                        problems.append(f"{host.name}: an IPv6 route {dst} on {route.get('dev')}")
                    elif family == "-4" and route.get("dev") != "lo" and kind in ("unicast", "local"):
                        if not ipaddress.ip_network(dst, strict=False).subnet_of(subnet):
                            problems.append(f"{host.name}: a route to {dst} outside {subnet}")
        problems += _nat_problems(subnet)
        return problems

    def verify_isolated(self) -> None:
        problems = self.isolation_problems()
        if problems:
            raise NetworkError("the test network is not isolated; nothing was started:\n  " + "\n  ".join(problems))


def _nat_problems(subnet: ipaddress.IPv4Network) -> list[str]:
    """A NAT table that could translate the subnet's packets. Without iptables' tools a loaded nat table cannot be
    read, so it counts as a problem; none loaded (``/proc/net/ip_tables_names``) means no NAT."""
    names = Path("/proc/net/ip_tables_names")
    loaded = names.read_text().split() if names.exists() else []
    if "nat" not in loaded:
        return []
    save = shutil.which("iptables-save")
    if save is None:
        return ["an iptables nat table is loaded and iptables-save is not installed to show that it does not "
                f"translate {subnet}"]
    rules = subprocess.run([save, "-t", "nat"], capture_output=True, text=True, timeout=30).stdout
    base = str(subnet.network_address).rsplit(".", 2)[0]
    return [f"NAT rule: {line}" for line in rules.splitlines()
            if line.startswith("-A") and (base in line or "MASQUERADE" in line)]


def _write_if_present(path: str, value: str) -> None:
    if os.path.exists(path):
        Path(path).write_text(value)
