"""How many CPU threads a site process may use: the host's cores shared by the site processes on it.

Torch uses every core of the host in every process by default. A real deployment runs one site per host and
that is right there; but the simulator and the POC run several site processes on one host at once, and then
each one's thread pool fights the others' for the same cores (measured on a 16-core GPU host with three site
processes: CPU-side augmentation of one epoch 0.5 s alone, 10.6-12.0 s side by side; 0.6-0.8 s with 2 threads
each). NVFlare does not tell a site how many siblings it has, so the one who starts them says so:

* ``FEDDG_SITE_PROCESSES`` (environment): the number of site processes that run at once on this host.
  ``feddg simulate`` sets it to the simulator's ``-t`` (capped at the number of sites) and ``feddg poc`` to the
  number of hospitals; the simulator and the POC pass their environment on to every site process. A plain
  ``nvflare simulator -t N`` run does not set it: every site then takes all cores, as in a real deployment; set
  ``FEDDG_SITE_PROCESSES=N`` yourself for such runs.
* ``FEDDG_CONCURRENT_RUNS`` (environment): how many simulator runs share this host at once (the sweep's
  ``--parallel N``); ``feddg simulate`` multiplies its site processes by it, so that the budget counts every site
  process on the host.
* ``num_threads`` in the site's own ``local/feddg_site.json`` wins over both (a hospital that shares its host
  with other work, or wants fewer threads for the job).

The budget is ``max(1, cores // site processes)``, where the cores are those this process may run on (its CPU
affinity, and a cgroup CPU quota where one is set, as in containers).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

SITE_PROCESSES_ENV = "FEDDG_SITE_PROCESSES"
CONCURRENT_RUNS_ENV = "FEDDG_CONCURRENT_RUNS"
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")

logger = logging.getLogger(__name__)
_applied: int | None = None  # the budget this process runs with (logged once)


class ThreadBudgetError(ValueError):
    """A thread setting cannot be used; the message names the variable or file."""


@dataclass(frozen=True)
class ThreadBudget:
    """The threads of one site process and why.

    Attributes:
        threads: torch's intra-op threads (and OpenMP's) in this process.
        cores: the cores this process may run on.
        site_processes: the site processes that share them (1 when nobody said otherwise).
        source: where the number comes from: "site" (``num_threads`` in ``feddg_site.json``), or "shared"
            (cores divided by the site processes).
    """

    threads: int
    cores: int
    site_processes: int
    source: str

    def describe(self) -> str:
        if self.source == "site":
            return f"{self.threads} thread(s), set by the site's num_threads ({self.cores} core(s) available)"
        return (f"{self.threads} thread(s): {self.cores} core(s) shared by {self.site_processes} site process(es) "
                f"on this host ({SITE_PROCESSES_ENV})")


def available_cores(cgroup_cpu_max: Path = _CGROUP_CPU_MAX) -> int:
    """The cores this process may use: its CPU affinity, lowered by a cgroup v2 CPU quota (``cpu.max``) if any."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _positive_int_from_env(name: str, meaning: str, environ: dict[str, str] | None) -> int:
    """The environment variable ``name`` as a positive integer; 1 when it is not set; ThreadBudgetError naming it
    and what it counts (``meaning``) otherwise."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "":
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ThreadBudgetError(f"environment variable {name}={raw!r}: expected a positive integer ({meaning})")
    return value


def site_processes_from_env(environ: dict[str, str] | None = None) -> int:
    """``FEDDG_SITE_PROCESSES`` as a positive integer; 1 when it is not set."""
    return _positive_int_from_env(SITE_PROCESSES_ENV, "the number of site processes that run at once on this host",
                                  environ)


def concurrent_runs_from_env(environ: dict[str, str] | None = None) -> int:
    """``FEDDG_CONCURRENT_RUNS`` as a positive integer (the simulator runs sharing this host); 1 when not set."""
    return _positive_int_from_env(CONCURRENT_RUNS_ENV, "the number of simulator runs that share this host at once",
                                  environ)


def thread_budget(cores: int, site_processes: int, site_threads: int | None = None) -> ThreadBudget:
    """The threads of one site process: the site's own ``num_threads`` if given, else the cores divided by the
    site processes sharing them, at least 1."""
    if site_threads is not None:
        return ThreadBudget(site_threads, cores, site_processes, "site")
    return ThreadBudget(max(1, cores // max(1, site_processes)), cores, site_processes, "shared")


def apply_thread_budget(site_threads: int | None = None) -> ThreadBudget:
    """Compute this process's budget (:func:`thread_budget` from :func:`available_cores` and the environment) and
    set torch's threads to it; logged once per process (again only if it changes)."""
    import torch

    global _applied
    budget = thread_budget(available_cores(), site_processes_from_env(), site_threads)
    if torch.get_num_threads() != budget.threads:
        torch.set_num_threads(budget.threads)  # also sets OpenMP's threads for torch's kernels
    if _applied != budget.threads:
        logger.info("site compute: %s", budget.describe())
        _applied = budget.threads
    return budget
