"""The thread budget of a site process: cores shared by the site processes on a host, the site's own override,
the cgroup quota, bad settings named."""

from __future__ import annotations

import subprocess
import sys

import pytest

from feddg.compute import (
    SITE_PROCESSES_ENV,
    ThreadBudgetError,
    available_cores,
    site_processes_from_env,
    thread_budget,
)


@pytest.mark.parametrize("cores, processes, expected", [(16, 3, 5), (16, 1, 16), (2, 6, 1), (2, 2, 1), (8, 8, 1),
                                                        (4, 3, 1), (1, 1, 1)])
def test_cores_divided_by_the_site_processes_at_least_one(cores, processes, expected):
    budget = thread_budget(cores, processes)
    assert budget.threads == expected and budget.source == "shared"
    assert f"{cores} core(s) shared by {processes} site process(es)" in budget.describe()


def test_the_sites_own_setting_wins():
    budget = thread_budget(16, 8, site_threads=6)
    assert budget.threads == 6 and budget.source == "site" and "num_threads" in budget.describe()


def test_environment_variable_read_and_checked():
    assert site_processes_from_env({}) == 1
    assert site_processes_from_env({SITE_PROCESSES_ENV: "6"}) == 6
    for bad in ("0", "-2", "three", "1.5"):
        with pytest.raises(ThreadBudgetError, match=f"{SITE_PROCESSES_ENV}={bad!r}"):
            site_processes_from_env({SITE_PROCESSES_ENV: bad})


def test_cgroup_quota_lowers_the_cores(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    unlimited = available_cores(tmp_path / "absent")
    cpu_max.write_text("max 100000\n")
    assert available_cores(cpu_max) == unlimited
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs of quota: one whole core
    assert available_cores(cpu_max) == 1
    cpu_max.write_text("garbage\n")
    assert available_cores(cpu_max) == unlimited


def test_applied_to_torch_in_a_fresh_process():
    # torch's thread pool is process-wide: checked in a child so this test process keeps its own.
    code = ("import torch; from feddg.compute import apply_thread_budget; b = apply_thread_budget(); "
            "print(b.threads, torch.get_num_threads())")
    import os

    env = {**os.environ, SITE_PROCESSES_ENV: "64"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["1", "1"]
    code_site = code.replace("apply_thread_budget()", "apply_thread_budget(3)")
    out = subprocess.run([sys.executable, "-c", code_site], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.split() == ["3", "3"]
