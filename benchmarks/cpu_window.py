"""Give this machine's CPU signature to the runs a session made here with code that predates it: a window in the
results folder's ``cpu_timeline.json``, written only after a probe showed this machine repeats a run of the family
the window makes (docs/benchmark.md, "CPU numerics").

    python benchmarks/same_cell.py FOLDER/runs/<cell>/run.json /tmp/probe/runs/<cell>/run.json \\
        --label set --label here --rounds 3 --out /tmp/probe/same                   # the probe, made here
    python benchmarks/cpu_window.py FOLDER --probe /tmp/probe/same --from 2026-12-02T00:36Z [--until ...]

The window holds the runs that ended in [``--from``, ``--until``) (``--until``: now; give the session's end to
cover runs still going), and says the machine that made them: this machine's CPU model, AVX-512 and signature
(:func:`feddg.numerics.host_cpu`). It is written first in the list (the first window that holds a run is its
window), with the probe it rests on: the reference run, the codes, what was compared (rounds, or every case score),
when the probe started. Refused, with nothing written, naming the reason: a probe whose runs differ or compared
nothing; whose reference is not a run of ``FOLDER``; whose other runs are the folder's, did not end in the window, or
were made on another CPU model or AVX-512 than this machine's (the admitted code records no signature, so a run of
another generation of the same model is told apart only by the window's bounds); a reference of another family
than this machine's (a family without a signature is joined by running as its runs did, with no window: the tool
says so); a window that overlaps another signed one, that holds a run recorded on another CPU model or AVX-512,
that would sign a run that ended before the probe started, or a run of a seed another family holds. The runs it
signs are printed: a ``--from`` earlier than the session would show another session's runs there.

A machine whose family the folder does not hold yet founds one with a seed of its own: the probe is made first (the
new seed's first cell, three rounds, beside the folder), the sweep then makes that cell in the folder, and the probe
compares the sweep's run with it:

    python benchmarks/admitted_sweep.py --commit beb898b -- --task prostate --out /tmp/probe --methods fedavg \
        --held-out BIDMC --seeds 7 --set train.rounds=3                                # before the sweep
    python benchmarks/same_cell.py FOLDER/runs/prostate_fedavg_BIDMC_seed7/run.json \
        /tmp/probe/runs/prostate_fedavg_BIDMC_seed7/run.json --label set --label here --rounds 3 --out /tmp/probe/same

The reference then ended in the window, so it is one of the runs the window signs (the window records
``"founds": true`` when no run outside it is of this machine's family): the probe shows the runs repeat on this
machine, the window's bounds that this session made them.
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

from feddg.benchmark.record import (ASIDE_DIR, CPU_TIMELINE, cpu_timeline, run_family, run_records, seed_families,
                                    utc_time)
from feddg.config import ConfigError
from feddg.jsonfile import read_json, write_json
from feddg.numerics import host_cpu, host_family

sys.path.insert(0, str(Path(__file__).resolve().parent))
from same_cell import SAME_CELL_FILE  # noqa: E402  (next to this script)


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
    reference is of a family without a signature, which runs made here join as they are (no window needed).
    ConfigError naming what is wrong otherwise: the probe's runs differ from its reference or compared nothing, its
    reference is not a run of ``out``, one of its other runs is one of ``out``'s, was not made in the window, or on
    a CPU other than ``cpu`` (as far as the run recorded it: the admitted code records no signature), or the
    reference's family is not the one this window makes (a reference that ended in the window is read with it: the
    first window of a family, whose reference is one of the runs it signs)."""
    if not start < until:
        raise ConfigError(f"--from {utc_time(start)} is not before --until {utc_time(until)}")
    if not cpu.get("cpu_signature"):
        raise ConfigError("this machine's CPU signature cannot be read (feddg.numerics.cpu_signature): a window "
                          "gives a signature, so there is none to give")
    runs, rows = probe.get("runs"), probe.get("rows")
    if not (isinstance(runs, list) and isinstance(rows, list) and len(runs) == len(rows) >= 2):
        raise ConfigError("the probe is not benchmarks/same_cell.py's output (runs and rows, two or more)")
    differing = [r.get("label") for r in rows[1:] if r.get("first_loss_difference") or r.get("differing_case_scores")]
    if differing:
        raise ConfigError(f"the probe's runs {differing} differ from its reference: this machine does not repeat it")
    if not all(r.get("rounds_compared") or r.get("case_scores") for r in rows[1:]):
        raise ConfigError("the probe compared no training round and no case score")
    folder = Path(out).resolve()
    reference_path = Path(runs[0]).resolve()
    if reference_path.parent.parent != folder / "runs":
        raise ConfigError(f"the probe's reference {runs[0]} is not a run of {out}")
    records = run_records(out)  # read once with the folder's timeline (and once more with the window, below)
    reference = records.get(reference_path.parent.name)
    if reference is None:
        raise ConfigError(f"the probe's reference {runs[0]} is not a readable run of {out}")
    started = []
    for path in runs[1:]:
        if folder in Path(path).resolve().parents:
            raise ConfigError(f"the probe's run {path} is in {out}: a probe is a run made here, beside the folder")
        record = read_json(Path(path))
        executor = record.get("executor") or {}
        made = (executor.get("cpu"), executor.get("avx512"), executor.get("cpu_signature") or cpu["cpu_signature"])
        if made != (cpu["cpu"], cpu["avx512"], cpu["cpu_signature"]):
            raise ConfigError(f"the probe's run {path} was made on {made[0]} (avx512 {made[1]}, signature "
                              f"{made[2]}), not on this machine ({cpu['cpu']}, {cpu['avx512']}, "
                              f"{cpu['cpu_signature']})")
        ended = record.get("ended_at")
        if not (isinstance(ended, (int, float)) and start <= ended < until):
            raise ConfigError(f"the probe's run {path} did not end in the window (ended_at {ended!r}): it is not "
                              "this session's")
        started.append(ended - record.get("wall_s", 0))
    compared = {"rounds": min(r["rounds_compared"] for r in rows[1:])} if all(
        r.get("rounds_compared") for r in rows[1:]) else {"case_scores": min(r["case_scores"] for r in rows[1:])}
    window = {"cpu": cpu["cpu"], "avx512": cpu["avx512"], "signature": cpu["cpu_signature"],
              "from": math.floor(start), "until": math.ceil(until),
              "probe": {"reference": reference_path.parent.name, "codes": sorted({str(r.get("code")) for r in rows}),
                        **compared, "differences": 0, "started": math.floor(min(started)), "written": utc_time()}}
    pin = reference.get("cpu_pin", "off")
    here = host_family(pin, cpu)
    ended = reference.get("ended_at")
    if isinstance(ended, (int, float)) and window["from"] <= ended < window["until"]:
        # The reference is one of the session's own runs, which this window signs, so the family check below
        # compares the window with itself: the probe (made before the runs it signs, add_window) is the evidence
        # that the runs repeat here, and the window's bounds that this session made them. It founds a family when
        # no run outside the window is of it.
        theirs = run_family(run_records(out, windows=[window, *cpu_timeline(out)])[reference_path.parent.name])
        if all(run_family(r) != here for r in records.values()):
            window["probe"]["founds"] = True
    else:
        theirs = run_family(reference)
        if theirs == host_family(pin, {**cpu, "cpu_signature": None}):
            return None
    if theirs != here:
        raise ConfigError(f"the probe's reference is of family {theirs!r}, this machine's is {here!r}")
    return window


def add_window(out: Path, window: dict[str, Any]) -> list[str]:
    """Write ``window`` first in ``out``'s timeline, and return the runs it gives a signature to (in name order).
    Checked before anything is written, with the whole folder read as the tables will read it: ConfigError when it
    overlaps another window with a signature, when it would hold a run made on another CPU
    (:func:`feddg.benchmark.record.run_records`), give the signature to a run that ended before the probe
    started (the probe speaks for the machine from then on), or to a run of a seed that another family's runs hold
    (:func:`feddg.benchmark.record.seed_families`: the run would leave its seed's pairs)."""
    path = Path(out) / CPU_TIMELINE
    windows = cpu_timeline(out)
    for i, w in enumerate(windows):
        overlaps = w.get("from", -math.inf) < window["until"] and window["from"] < w.get("until", math.inf)
        if "signature" in w and overlaps:
            raise ConfigError(f"{path}: the window overlaps windows[{i}] (signature {w['signature']!r}); "
                              "narrow --from or --until")
    new = [window, *windows]
    signed, kept = {}, {}  # kept: runs/ as the new timeline reads it
    for under in ("runs", ASIDE_DIR):
        before, after = run_records(out, under=under), run_records(out, under=under, windows=new)
        signed |= {f"{under}/{name}": r for name, r in after.items() if run_family(r) != run_family(before[name])}
        if under == "runs":
            kept = after
    early = sorted(name for name, r in signed.items() if r.get("ended_at", -math.inf) < window["probe"]["started"])
    if early:
        raise ConfigError(f"{path}: the window would sign {early}, which ended before the probe started; "
                          "narrow --from")
    owners = seed_families(r for name, r in kept.items() if f"runs/{name}" not in signed)
    taken = sorted(f"{name} (seed {seed}: {owners[seed]})" for name, r in signed.items()
                   if name.startswith("runs/") and owners.get(seed := r["run"]["seed"], run_family(r)) != run_family(r))
    if taken:
        raise ConfigError(f"{path}: the window would sign {taken}, whose seeds another family holds: a seed's runs "
                          "come from one family, so this machine makes a seed of its own")
    data = read_json(path) if path.exists() else {}
    write_json(path, {"source": data.get("source") or "each window's probe (benchmarks/cpu_window.py)",
                      **{k: v for k, v in data.items() if k != "source"}, "windows": new}, indent=2)
    return sorted(signed)


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
        signed = add_window(args.folder, window)
    except (ConfigError, ValueError) as e:  # ValueError: a file that is not JSON (feddg.jsonfile names it)
        print(f"refused: {e}", file=sys.stderr)
        return 2
    print(f"{args.folder / CPU_TIMELINE}: window {window['signature']} ({window['cpu']}, avx512 "
          f"{window['avx512']}) for runs ended from {utc_time(window['from'])} until {utc_time(window['until'])}; "
          f"it signs {len(signed)} run(s): {', '.join(signed) or 'none yet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
