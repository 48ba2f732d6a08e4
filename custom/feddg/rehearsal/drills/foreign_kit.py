"""``foreign-kit``: kits from another provisioning of the same project (another root CA) try to join and to submit
from the intruder's namespace while the job runs.

Expected: every attempt refused by TLS, no connection from the intruder's address accepted by the server, the running
job unaffected (checked on its report). The attempts: the foreign hospital's client as it comes (it does not trust
our server's certificate); a TLS handshake with the foreign hospital's client certificate that trusts our root CA
(public in every kit; a client kit with it swapped in fails its own startup signature check, so the handshake is
made directly): the server must refuse the certificate; the same handshake with our own hospital's certificate, which
must be accepted (so the refusal is the certificate's, not the network's); the foreign lead's admin console, and, as
its control, our own lead's admin kit from the same namespace, which must be let in and whose session must show in
the server's log (so that no session for the foreign kits means refused, not unlogged).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from feddg.poc import start_participant, stop_processes
from feddg.provisioning import FED_LEARN_PORT, hospital_admins
from feddg.rehearsal.consortium import INTRUDER, SERVER_NAME, Rehearsal
from feddg.rehearsal.outcomes import Check, DrillOutcome
from feddg.rehearsal.processes import server_log_since, server_log_size, wait_for_line


def foreign_kit(r: Rehearsal, job_id: str) -> Check:
    """The attempts and their controls (see the module docstring); the check adds that the job finished its rounds.
    Runs in a thread of its own beside the link drills (it touches no link)."""
    site = r.poc.clients[0]
    intruder = r.net.hosts[INTRUDER].address
    before = server_log_size(r)
    attempts: dict[str, dict[str, Any]] = {}
    kit = r.foreign / site
    proc = start_participant(kit, r.log("intruder_client"), prefix=r.net.prefix(INTRUDER))
    r.poc.processes.append(proc)
    text = wait_for_line(kit / "log.txt", ("Successfully registered client", "failed with exception"), 180)
    stop_processes([proc])
    errors = [line.split(" - ", 3)[-1][:200] for line in text.splitlines() if " ERROR " in line]
    attempts["foreign client"] = {"refused": bool(text) and "Successfully registered client" not in text,
                                  "answer": errors[-1] if errors else "no connection attempt seen"}
    our_ca = r.poc.kit(site) / "startup" / "rootCA.pem"
    lead = hospital_admins(site)["lead"]

    def handshake(name: str, certs: Path) -> None:
        answer = r.net.command(INTRUDER, [sys.executable, "-m", "feddg.rehearsal.probe", "handshake", SERVER_NAME,
                                          str(FED_LEARN_PORT), str(our_ca), str(certs / "client.crt"),
                                          str(certs / "client.key")], timeout=60).stdout.strip()
        attempts[name] = {"refused": answer != '"accepted"', "answer": json.loads(answer) if answer else ""}

    def console(name: str, kit: Path) -> None:
        tried = subprocess.run(r.net.prefix(INTRUDER) + ["nvflare", "job", "list", "--startup-kit", str(kit)],
                               capture_output=True, text=True, timeout=120, env=r.poc.env)
        out = (tried.stdout + tried.stderr).strip()
        attempts[name] = {"refused": tried.returncode != 0, "answer": out.splitlines()[-1][:200] if out else ""}

    handshake("foreign certificate, our root CA", r.foreign / site / "startup")
    console("foreign admin", r.foreign / lead)
    controls_from = server_log_size(r)
    foreign_lines = [line for line in server_log_since(r, before).splitlines() if intruder in line]
    # The controls, from the same namespace with our own kits: they must get in, and the admin console's session
    # must show in the server's log, so that no session above means refused, not unlogged.
    handshake("our hospital's certificate (control)", r.poc.kit(site) / "startup")
    console("our lead's admin kit (control)", r.poc.kit(lead))
    control_lines = [line for line in server_log_since(r, controls_from).splitlines() if intruder in line]

    def check(report: dict) -> DrillOutcome:
        cfg = r.cfg
        history = report.get("history", [])
        unaffected = len(history) == cfg.train.rounds
        # "Connection ... is created": an NVFlare session, i.e. TLS passed
        sessions = [line for line in foreign_lines if "is created" in line]
        control_sessions = [line for line in control_lines if "is created" in line]
        expected = {name: not name.endswith("(control)") for name in attempts}
        as_expected = all(attempts[n]["refused"] == refused for n, refused in expected.items())
        passed = as_expected and not sessions and bool(control_sessions) and unaffected
        figures = {"attempts": attempts, "nvflare_connections_from_intruder": len(sessions),
                   "nvflare_connections_of_the_controls": len(control_sessions),
                   "server_log_lines_naming_intruder": foreign_lines[-5:], "job_rounds": len(history)}
        detail = ("; ".join(f"{n}: {'refused' if a['refused'] else 'accepted'}" for n, a in attempts.items())
                  + f"; NVFlare connections from {intruder}: {len(sessions)} of the foreign kits, "
                  + f"{len(control_sessions)} of the controls; job "
                  + ("finished all its rounds" if unaffected else "AFFECTED"))
        return DrillOutcome("foreign-kit", passed, figures, detail)

    return check
