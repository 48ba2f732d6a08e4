"""`feddg rehearse-network` for real: provisioned kits, a network namespace per participant, mTLS to the server's
name, and the drills that run during one job (tiny experiment, three hospitals)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from feddg.jobs import write_job
from feddg.rehearsal.command import DRILLS_FILE, rehearse_network
from feddg.rehearsal.network import STATE_FILE
from tests.conftest import tiny_experiment

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="network namespaces need root and iproute2")]


def test_a_job_on_separate_stacks_survives_a_link_flap_and_refuses_foreign_kits(tmp_path):
    exp = tiny_experiment("prostate", rounds=4, local_epochs=2, task_timeout=120)
    exp["data"]["sites"] = ["BIDMC", "BMC", "RUNMC"]
    job = write_job(tmp_path / "jobs", "prostate_fedavg", exp)
    ws = tmp_path / "ws"
    outcomes = {o.name: o for o in rehearse_network(job, ws, ["link-flap", "foreign-kit"], subnet="198.19.9.0/24",
                                                      timeout=900)}
    flap = outcomes["link-flap"]
    assert flap.passed, flap.detail
    assert flap.figures["sites_per_round"] == [2, 2, 2, 2]
    assert flap.figures["round_1_waited_s"] >= 5  # the round did wait for the cut link
    foreign = outcomes["foreign-kit"]
    assert foreign.passed, foreign.detail
    attempts = foreign.figures["attempts"]
    assert attempts["foreign certificate, our root CA"]["refused"]
    assert not attempts["our hospital's certificate (control)"]["refused"]
    assert foreign.figures["nvflare_connections_from_intruder"] == 0
    written = json.loads((ws / DRILLS_FILE).read_text())
    assert [d["name"] for d in written["drills"]] == ["link-flap", "foreign-kit"]
    # everything it made is gone: namespaces, bridge, hosts files
    state = json.loads((ws / STATE_FILE).read_text())
    assert not any(Path("/run/netns", h["namespace"]).exists() for h in state["hosts"].values())
    assert subprocess.run(["ip", "link", "show", state["bridge"]], capture_output=True).returncode != 0
