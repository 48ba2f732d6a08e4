"""``exposure``: what the consortium's hosts offer the network, seen from an intruder's namespace and from inside.

Expected: only the server's fed-learn and admin ports accept a connection from the network, neither gives anything
to a client without a kit's certificate, and during the job nothing else listens on an address other than loopback.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from feddg.provisioning import ADMIN_PORT, FED_LEARN_PORT
from feddg.rehearsal.consortium import INTRUDER, SERVER_NAME, Rehearsal
from feddg.rehearsal.outcomes import Check, DrillOutcome
from feddg.rehearsal.processes import wait_for_rounds


def probe_ports(r: Rehearsal) -> dict[str, Any]:
    """The first half of ``exposure``, before the job is submitted (a port probe may not meet a cut link): from the
    intruder's namespace, every TCP port (1-65535) of every other participant, once
    (:func:`feddg.rehearsal.probe.open_ports`), and what each open port gives a client without a kit's certificate
    (plain bytes, and a TLS handshake without a client certificate)."""
    targets = {name: host.address for name, host in r.net.hosts.items() if name != INTRUDER}
    started = time.monotonic()
    out = r.net.command(INTRUDER, [sys.executable, "-m", "feddg.rehearsal.probe", "ports", *targets.values()],
                        timeout=900).stdout
    by_address = json.loads(out)
    found = {name: by_address[address] for name, address in targets.items()}
    answers = {}
    for name, ports in found.items():
        for port in ports:
            reply = r.net.command(INTRUDER, [sys.executable, "-m", "feddg.rehearsal.probe", "serves",
                                             targets[name], str(port)], timeout=60).stdout
            answers[f"{name}:{port}"] = json.loads(reply)
    return {"ports_probed_per_host": 65535, "hosts": len(targets), "probe_s": round(time.monotonic() - started, 1),
            "open": found, "answers_without_certificate": answers}


def exposure(r: Rehearsal, job_id: str) -> Check:
    """The port probe taken before the job (:func:`probe_ports`, in ``r.probe``), and, once the job has completed a
    round, every participant's listening TCP sockets (``ss`` inside its namespace: the job processes' too)."""
    wait_for_rounds(r, job_id, 1, 600)
    listening = {}
    for name in r.net.hosts:
        if name == INTRUDER:
            continue
        out = r.net.command(name, ["ss", "-Htln"]).stdout
        local = [line.split()[3] for line in out.splitlines() if len(line.split()) > 3]
        listening[name] = sorted(a for a in local if not a.startswith(("127.", "[::1]", "localhost")))
    probe = r.probe or {}
    found = probe.get("open", {})
    expected = {name: ([FED_LEARN_PORT, ADMIN_PORT] if name == SERVER_NAME else []) for name in found}
    served = {where: a for where, a in probe.get("answers_without_certificate", {}).items()
              if a.get("plain") != "nothing" or a.get("tls without a certificate") == "accepted"}
    server_ports = {f":{FED_LEARN_PORT}", f":{ADMIN_PORT}"}
    extra = {name: [a for a in addresses if not (name == SERVER_NAME and a[a.rfind(":"):] in server_ports)]
             for name, addresses in listening.items()}
    extra = {name: addresses for name, addresses in extra.items() if addresses}
    passed = bool(found) and found == expected and not served and not extra
    figures = {**probe, "listening_during_job": listening}

    def check(_report: dict) -> DrillOutcome:
        opened = ", ".join(f"{n}:{p}" for n, ports in found.items() for p in ports) or "none"
        detail = (f"open ports of {probe.get('hosts')} hosts ({probe.get('probe_s')} s for 65535 ports each): "
                  f"{opened}; " + ("nothing served without a kit's certificate" if not served else f"SERVED: {served}")
                  + "; during the job " + ("nothing else listens off loopback" if not extra
                                          else f"ALSO LISTENING: {extra}"))
        return DrillOutcome("exposure", passed, figures, detail)

    return check
