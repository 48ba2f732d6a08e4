"""`feddg simulate` runs every site's process at once unless told otherwise, and tells the sites how many share
the host."""

from __future__ import annotations

import json
import os

import pytest

from feddg.cli import main
from feddg.simulate import SIMULATOR_MODULE, deploy_map_sites, simulator_threads
from tests.conftest import REPOSITORY

JOB = REPOSITORY / "jobs" / "prostate_ga"


@pytest.mark.parametrize("rest, args, processes", [
    ([], ["-t", "6"], 6),                                   # every site of the deploy map at once
    (["-t", "2"], ["-t", "2"], 2),                          # the user's -t is kept
    (["--threads", "9"], ["--threads", "9"], 6),            # (nvflare refuses it; at most the sites run at once)
    (["-n", "3"], ["-n", "3", "-t", "3"], 3),
    (["-c", "BMC,HK"], ["-c", "BMC,HK", "-t", "2"], 2),
    (["-gpu", "0"], ["-gpu", "0", "-t", "6"], 6),           # one GPU group: all sites share it
    (["-gpu", "0,1"], ["-gpu", "0,1"], 2),                  # NVFlare runs one site per GPU group at a time
])
def test_threads_default_to_the_sites(rest, args, processes):
    assert simulator_threads(JOB, rest) == (args, processes)


def test_deploy_map_sites(tmp_path):
    assert deploy_map_sites(JOB) == {"BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"}
    (tmp_path / "meta.json").write_text(json.dumps({"deploy_map": {"app": ["@ALL"]}}))
    assert deploy_map_sites(tmp_path) == set()
    assert simulator_threads(tmp_path, []) == ([], 1)  # unknown sites: NVFlare's own default stays
    assert deploy_map_sites(tmp_path / "missing") == set()


def test_a_mistyped_simulator_flag_is_refused_by_name_before_anything_is_written(tmp_path, capsys):
    assert main(["simulate", str(JOB), "-w", str(tmp_path / "ws"), "--heldout", "BMC"]) == 2
    assert "feddg simulate: error: --heldout BMC: not a flag of nvflare simulator" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()


def test_flags_before_and_after_dashes_reach_the_simulator_without_the_dashes(tmp_path, monkeypatch):
    commands: list = []

    def execv(path, command):
        commands.append(command)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    ws = tmp_path / "ws"
    with pytest.raises(SystemExit):
        main(["simulate", str(JOB), "-w", str(ws), "-n", "6", "--", "-t", "2"])
    assert commands[0][1:] == ["-m", SIMULATOR_MODULE, str(JOB), "-w", str(ws), "-n", "6", "-t", "2"]
