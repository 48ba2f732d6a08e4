"""`feddg rehearse-network` for real, as a hospital's IT would run it: its own small job (three hospitals), the
provisioned kits on a network namespace each, mTLS to the server's name, and all five drills, with their figures
checked; then nothing of the run may be left (namespaces, links, hosts files, processes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
import pytest

from feddg.provisioning import ADMIN_PORT, FED_LEARN_PORT
from feddg.flare.registry import server_files
from feddg.rehearsal.command import rehearse_network
from feddg.rehearsal.consortium import SERVER_NAME
from feddg.rehearsal.options import DRILLS
from feddg.rehearsal.outcomes import DRILLS_FILE
from feddg.rehearsal.small_job import SMALL_ROUNDS
from feddg.rehearsal.network import STATE_FILE
from tests.conftest import needs_netns

pytestmark = [pytest.mark.slow, needs_netns]


def test_the_small_job_on_separate_stacks_passes_every_drill_and_leaves_nothing(tmp_path):
    ws = tmp_path / "ws"
    outcomes = {o.name: o for o in rehearse_network(None, ws, list(DRILLS), subnet="198.19.9.0/24", timeout=900)}
    assert list(outcomes) == DRILLS

    exposure = outcomes["exposure"]
    assert exposure.passed, exposure.detail
    open_ports = {host: ports for host, ports in exposure.figures["open"].items() if ports}
    assert open_ports == {SERVER_NAME: [FED_LEARN_PORT, ADMIN_PORT]}
    assert all(a["plain"] == "nothing" and a["tls without a certificate"] != "accepted"
               for a in exposure.figures["answers_without_certificate"].values())

    flap = outcomes["link-flap"]
    assert flap.passed, flap.detail
    assert set(flap.figures["sites_per_round"]) == {2} and flap.figures["rounds_checked"] > flap.figures["cut_in_round"] + 1

    loss = outcomes["link-loss"]
    assert loss.passed, loss.detail
    assert loss.figures["site"] == "BIDMC" and loss.figures["lost_in_round"] is not None
    assert loss.figures["evaluation_missing"] == ["BIDMC"] and "RUNMC" in loss.figures["sites_scored"]

    foreign = outcomes["foreign-kit"]
    assert foreign.passed, foreign.detail
    assert foreign.figures["attempts"]["foreign certificate, our root CA"]["refused"]
    assert not foreign.figures["attempts"]["our hospital's certificate (control)"]["refused"]
    assert foreign.figures["nvflare_connections_from_intruder"] == 0
    assert not foreign.figures["attempts"]["our lead's admin kit (control)"]["refused"]
    assert foreign.figures["attempts"]["foreign admin"]["refused"]
    assert foreign.figures["nvflare_connections_of_the_controls"] >= 1  # the log shows a session that got in

    restart = outcomes["server-restart"]
    assert restart.passed, restart.detail
    assert restart.figures["files_checked"] > 0 and restart.figures["files_changed"] == []
    assert restart.figures["hospitals_restarted"] == []
    start = restart.figures["resumed_from_round"]
    assert restart.figures["resumed_rounds"] == list(range(start, SMALL_ROUNDS))
    # the small job is GA's: its weight history is a resumable server file, continued over every round
    resumable = {f.name for f in server_files() if f.resume_arg is not None}
    assert restart.figures["killed_job_histories"] and set(restart.figures["killed_job_histories"]) <= resumable
    assert restart.figures["resumed_histories"] == {name: list(range(SMALL_ROUNDS))
                                                     for name in restart.figures["killed_job_histories"]}

    written = json.loads((ws / DRILLS_FILE).read_text())
    assert [d["name"] for d in written["drills"]] == DRILLS
    # everything it made is gone: namespaces, bridge, hosts files, processes started from its kits
    state = json.loads((ws / STATE_FILE).read_text())
    assert not any(Path("/run/netns", h["namespace"]).exists() for h in state["hosts"].values())
    assert not any(Path("/etc/netns", h["namespace"]).exists() for h in state["hosts"].values())
    assert subprocess.run(["ip", "link", "show", state["bridge"]], capture_output=True).returncode != 0
    kits = str(ws / "kits")
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if kits in " ".join(p.info["cmdline"] or [])]
