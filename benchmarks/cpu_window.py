"""Give this machine's CPU signature to the runs a session made here with code that predates it: a window in the
results folder's ``cpu_timeline.json``, written only after a probe showed this machine repeats a run of the family
the window makes (docs/benchmark.md, "CPU numerics").

    python benchmarks/same_cell.py FOLDER/runs/<cell>/run.json /tmp/probe/runs/<cell>/run.json \\
        --label set --label here --rounds 3 --out /tmp/probe/same                   # the probe, made here
    python benchmarks/cpu_window.py FOLDER --probe /tmp/probe/same --from 2026-12-02T00:36Z [--until ...]

The window holds the runs that ended in [``--from``, ``--until``) (``--until``: now), and says the machine that made
them: this machine's CPU model, AVX-512 and signature (:func:`feddg.numerics.host_cpu`). It is written first in the
list (the first window that holds a run is its window), with the probe it rests on: the compared runs, their code,
the rounds, and that no training loss differed. Refused, with nothing written, naming the reason: a probe whose runs
differ, whose reference is not a run of ``FOLDER``, or whose other runs were not made on a machine like this one; a
reference of another family than this machine's (a family without a signature is joined by running as the runs
did, with no window: the tool says so); a window that overlaps another signed one; a window that would put a run
made elsewhere under this machine (:func:`feddg.benchmark.record.run_records` checks the whole folder with it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from feddg.benchmark.record import CPU_TIMELINE, cpu_timeline, run_family, run_records
from feddg.config import ConfigError
from feddg.jsonfile import read_json, write_json
from feddg.numerics import host_cpu, numbers_family

SAME_CELL_FILE = "same_cell.json"  # benchmarks/same_cell.py's output


def epoch(text: str) -> float:
    """Seconds since the epoch from ISO 8601 (``2026-12-02T00:36Z``; UTC unless it says otherwise) or a number."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an ISO 8601 time nor epoch seconds") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def probe_window(out: Path, probe: dict[str, Any], start: float, until: float,
                 cpu: dict[str, Any]) -> dict[str, Any] | None:
    """The window for runs of ``out`` that ended in [``start``, ``until``) on a machine with ``cpu``
    (:func:`feddg.numerics.host_cpu`'s fields), from a probe (``same_cell.json``'s content); None when the probe's
    reference is of a family without a signature that this machine joins as it is (no window needed). ConfigError
    naming what is wrong otherwise."""
    if not start < until:
        raise ConfigError(f"--from {start} is not before --until {until}")
    runs, rows = probe.get("runs"), probe.get("rows")
    if not (isinstance(runs, list) and isinstance(rows, list) and len(runs) == len(rows) >= 2):
        raise ConfigError("the probe is not benchmarks/same_cell.py's output (runs and rows, two or more)")
    differing = [r.get("label") for r in rows[1:] if r.get("first_loss_difference") or r.get("differing_case_scores")]
    if differing:
        raise ConfigError(f"the probe's runs {differing} differ from its reference: this machine does not repeat it")
    if not all(r.get("rounds_compared") for r in rows[1:]):
        raise ConfigError("the probe compared no training round")
    reference_path = Path(runs[0]).resolve()
    folder_runs = (Path(out) / "runs").resolve()
    if reference_path.parent.parent != folder_runs:
        raise ConfigError(f"the probe's reference {runs[0]} is not a run of {out}")
    records = run_records(out)
    reference = records.get(reference_path.parent.name)
    if reference is None:
        raise ConfigError(f"the probe's reference {runs[0]} is not a readable run of {out}")
    for path in runs[1:]:
        executor = read_json(Path(path)).get("executor") or {}
        made = (executor.get("cpu"), executor.get("avx512"), executor.get("cpu_signature") or cpu["cpu_signature"])
        if made != (cpu["cpu"], cpu["avx512"], cpu["cpu_signature"]):
            raise ConfigError(f"the probe's run {path} was made on {made[0]} (avx512 {made[1]}, signature "
                              f"{made[2]}), not on this machine ({cpu['cpu']}, {cpu['avx512']}, {cpu['cpu_signature']})")
    pin = reference.get("cpu_pin", "off")
    theirs = run_family(reference)
    here = numbers_family(cpu["cpu"], pin, cpu["avx512"], cpu["cpu_signature"])
    if theirs == numbers_family(cpu["cpu"], pin, cpu["avx512"]):
        return None
    if theirs != here:
        raise ConfigError(f"the probe's reference is of family {theirs!r}, this machine's is {here!r}")
    return {"cpu": cpu["cpu"], "avx512": cpu["avx512"], "signature": cpu["cpu_signature"],
            "from": math.floor(start), "until": math.ceil(until),
            "probe": {"reference": reference_path.parent.name, "codes": sorted({str(r.get("code")) for r in rows}),
                      "rounds": min(r["rounds_compared"] for r in rows[1:]), "training_losses": "identical",
                      "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}


def add_window(out: Path, window: dict[str, Any]) -> list[dict[str, Any]]:
    """``out``'s timeline with ``window`` first, written after the whole folder's runs were read with it (so a run
    the window would misplace is refused before anything is written); ConfigError when it overlaps another window
    with a signature."""
    path = Path(out) / CPU_TIMELINE
    data = read_json(path) if path.exists() else {}
    windows = cpu_timeline(out)
    for i, w in enumerate(windows):
        if "signature" in w and w.get("from", float("-inf")) < window["until"] \
                and window["from"] < w.get("until", float("inf")):
            raise ConfigError(f"{path}: the window overlaps windows[{i}] (signature {w['signature']!r}); "
                              "narrow --from or --until")
    data = {"source": data.get("source") or "the probes in each window's 'probe' (benchmarks/cpu_window.py)",
            **{k: v for k, v in data.items() if k != "source"}, "windows": [window, *windows]}
    original = path.read_bytes() if path.exists() else None
    write_json(path, data, indent=2)
    try:  # the folder read as the tables will read it, with the new timeline
        run_records(out)
    except ConfigError:
        if original is None:
            path.unlink()
        else:
            path.write_bytes(original)
        raise
    return data["windows"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the results folder (holds runs/ and cpu_timeline.json)")
    parser.add_argument("--probe", type=Path, required=True,
                        help=f"benchmarks/same_cell.py's --out folder (or its {SAME_CELL_FILE})")
    parser.add_argument("--from", dest="start", type=epoch, required=True,
                        help="the session's start (ISO 8601, UTC, or epoch seconds)")
    parser.add_argument("--until", type=epoch, default=None, help="the window's end (default: now)")
    args = parser.parse_args(argv)
    probe_file = args.probe / SAME_CELL_FILE if args.probe.is_dir() else args.probe
    try:
        if not (args.folder / "runs").is_dir():
            raise ConfigError(f"{args.folder}: not a results folder (no runs/)")
        window = probe_window(args.folder, read_json(probe_file), args.start,
                              time.time() if args.until is None else args.until, host_cpu())
        if window is None:
            print(f"{args.folder}: the probe's reference is of a family without a signature, which runs made here "
                  "join as they are; no window written")
            return 0
        add_window(args.folder, window)
    except ConfigError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    print(f"{args.folder / CPU_TIMELINE}: window {window['signature']} ({window['cpu']}, avx512 "
          f"{window['avx512']}) for runs ended {time.strftime('%Y-%m-%d %H:%M', time.gmtime(window['from']))} to "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(window['until']))} UTC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
