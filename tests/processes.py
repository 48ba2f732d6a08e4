"""Bounded runs of a command and the processes a test left behind, for the end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest


def run_bounded(command: list[str], timeout_s: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` in a session of its own with stdout and stderr together; past ``timeout_s`` its whole
    process group (the group this test created: the command and its children) is killed and the test fails with
    the output's tail."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, command))} exceeded {timeout_s} s:\n{out[-5000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out)


def processes_naming(folder: Path) -> list[int]:
    """The processes whose command line names ``folder`` (what a test's run left running there)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(folder) in part for part in (p.info["cmdline"] or [])):
                found.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
