"""Where a round's time goes: each participant appends one JSON line per task or round to a file of its own.

Nothing here leaves a site: a site writes ``feddg_timings.jsonl`` into its own run folder (next to its training
state), the server into its run folder. ``benchmarks/round_time.py`` reads them after a simulator run and breaks
each round down; an operator can read them to see what a round waits on.

Site record (task ``train``)::

    {"task": "train", "round": r, "received": t, "returned": t, "setup_s": s, "validation_s": s,
     "training_s": s, "data_s": s, "steps": n, "peak_rss_mib": m}

``received``/``returned`` are wall-clock times (``time.time()``) when the executor got the task and handed its
result back to NVFlare (which then filters, serializes and sends it); ``setup_s`` is the first task's data
loading (0 afterwards); ``validation_s`` covers the received model's validation and, for GA, the site's own
model's after training; ``data_s`` is the part of ``training_s`` spent producing batches (gathering rows, the
copy to the device and the augmentation; on a GPU the host's share, as the device works asynchronously).

Server records, one per round::

    {"round": r, "started": t, "results": {site: t received}, "results_in": t, "aggregation_s": s, "save_s": s,
     "ended": t, "peak_rss_mib": m}

and one per part of the run outside the rounds (``site_info`` at job start, ``evaluate_final``,
``evaluate_best``, ``report``)::

    {"phase": name, "started": t, "ended": t}

Times of different processes compare only on one host (one clock); across hosts they carry the clocks' offset.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

TIMINGS_FILE = "feddg_timings.jsonl"


def peak_rss_mib() -> float:
    """The peak resident memory of this process so far, MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)  # bytes on macOS, KiB on Linux


def append_timing(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as a JSON line (a failure to write is not the job's failure: it is ignored)."""
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError:
        pass


def read_timings(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a timings file, in order; a torn last line (a killed process) is skipped."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    records.append(value)
    except OSError:
        return []
    return records


def server_rounds(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The server's round records among ``records`` (those of its timings file that are not a phase's)."""
    return [r for r in records if "round" in r and "phase" not in r]


def server_phases(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Phase name -> the server's record of that part of the run outside the rounds (the last, if repeated)."""
    return {r["phase"]: r for r in records if "phase" in r}
