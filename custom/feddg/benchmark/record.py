"""A results folder's record of itself, checked rather than trusted.

``OUT/sweep.json`` holds the protocol every run shares, the design (every cell the folder's sweeps asked for,
:func:`record_design`) and the code evidence of reproduce checks;
``OUT/runs/<run id>/run.json`` each run's outcome with its own config; ``OUT/.sweep.lock`` the sweep working on
the folder. A sweep adds runs to a folder only when its protocol is the folder's (:func:`prepare_folder`) and every
run in the folder is a run of that protocol (:func:`check_records`); a ``sweep.json`` that is missing or damaged is
rebuilt from what the runs show, or the folder is refused; never is it replaced by a new command line. One sweep
works on a folder at a time (:func:`folder_lock`).
"""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from feddg.benchmark.executors.base import INTERRUPTED, OK  # a run's statuses; INTERRUPTED: run again on resume
from feddg.benchmark.protocol import Protocol, protocol_difference, protocol_from_runs, run_mismatch
from feddg.config import ConfigError
from feddg.jsonfile import read_json, read_json_object, write_json
from feddg.numerics import cpu_maker, numbers_family

RUN_FILE = "run.json"
SWEEP_FILE = "sweep.json"
LOCK_FILE = ".sweep.lock"
ASIDE_DIR = "aside"  # where --move-aside-mismatched puts runs that are not of the folder's protocol
PROTOCOL_KEYS = {"task": str, "overrides": dict, "simulator_args": list}
KEPT_KEYS = ("code_evidence", "design")  # what a rewritten sweep.json keeps of the old one

Report = Callable[[str], None]


def finished(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that finished (status ``ok``): the only ones with scores."""
    return [r for r in records if r.get("status") == OK]


def run_cpu(record: dict[str, Any]) -> str | None:
    """The CPU model a run was made on (its executor's ``cpu``, or what the folder's :data:`CPU_TIMELINE` says for a
    run from before runs kept it: :func:`run_records`), None when neither says."""
    return (record.get("executor") or {}).get("cpu")


CPU_TIMELINE = "cpu_timeline.json"  # in a results folder: which CPU made runs that predate executor.cpu


def cpu_timeline(out: Path) -> list[dict[str, Any]]:
    """The folder's :data:`CPU_TIMELINE`, checked: ``{"source": why we know, "windows": [{"cpu": model, "avx512":
    bool, "signature": cpu signature, "from": epoch s, "until": epoch s}, ...]}`` (``avx512``, ``signature``,
    ``from`` and ``until`` optional; a window is [from, until) of a run's ``ended_at``, one with neither holds every
    run; the first window that holds a run is its window), as the list of windows; [] without the file. ConfigError
    naming the file and the field otherwise. The provenance of runs that do not record their CPU or its signature
    (:func:`feddg.numerics.cpu_signature`), kept as data beside them, not typed into a table."""
    path = Path(out) / CPU_TIMELINE
    if not path.exists():
        return []
    data = read_json_object(path)
    if not (isinstance(data.get("source"), str) and data["source"].strip()):
        raise ConfigError(f"{path}: 'source' must say how the CPU models are known (the sessions' records)")
    windows = data.get("windows")
    if not isinstance(windows, list) or not windows:
        raise ConfigError(f"{path}: 'windows' must be a non-empty list of {{cpu, from, until}}")
    for i, w in enumerate(windows):
        if not (isinstance(w, dict) and isinstance(w.get("cpu"), str) and w["cpu"].strip()):
            raise ConfigError(f"{path}: windows[{i}].cpu must name a CPU model")
        if "avx512" in w and not isinstance(w["avx512"], bool):
            raise ConfigError(f"{path}: windows[{i}].avx512 is {w['avx512']!r}, not true or false")
        if "signature" in w and not (isinstance(w["signature"], str) and w["signature"].strip()):
            raise ConfigError(f"{path}: windows[{i}].signature must be a CPU signature (feddg.numerics.cpu_signature)")
        for key in ("from", "until"):
            if key in w and (isinstance(w[key], bool) or not isinstance(w[key], (int, float))
                             or not math.isfinite(w[key])):
                raise ConfigError(f"{path}: windows[{i}].{key} is {w[key]!r}, not a time in epoch seconds")
    return windows


def _window(windows: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any] | None:
    ended = record.get("ended_at")
    for w in windows:
        if "from" not in w and "until" not in w:  # the whole folder
            return w
        if isinstance(ended, (int, float)) and w.get("from", -math.inf) <= ended < w.get("until", math.inf):
            return w
    return None


# What every run.json holds (key -> kind), and what a finished one holds besides; older records may lack the rest
# (code, executor, ended_at), which the tables count as unknown.
RECORD_KEYS: dict[str, type | tuple[type, ...]] = {"run": dict, "run_id": str, "status": str,
                                                   "wall_s": (int, float), "config": dict}
RUN_KEYS = {"task": str, "method": str, "held_out": str, "seed": int}
FINISHED_KEYS = {"report": dict}


def check_record(path: Path, record: dict[str, Any], scores: bool = False) -> dict[str, Any]:
    """``record`` (read from ``path``) when it holds what a run record must (:data:`RECORD_KEYS`, ``run``'s
    :data:`RUN_KEYS`, and with ``scores``, for the tables, a finished run's :data:`FINISHED_KEYS`); ConfigError naming
    the file and the first missing or wrongly typed field otherwise, and for a wall time that is negative or not
    finite."""
    def kind_ok(value: Any, kind: type | tuple[type, ...]) -> bool:
        return isinstance(value, kind) and not isinstance(value, bool)

    wanted = [(k, record, kind) for k, kind in RECORD_KEYS.items()]
    wanted += [(f"run.{k}", record.get("run") or {}, kind) for k, kind in RUN_KEYS.items()]
    if scores and record.get("status") == OK:
        wanted += [(k, record, kind) for k, kind in FINISHED_KEYS.items()]
    for field, holder, kind in wanted:
        key = field.rpartition(".")[2]
        if not isinstance(holder, dict) or key not in holder:
            raise ConfigError(f"{path}: no {field!r}; a run record holds {sorted(RECORD_KEYS)} (run: "
                              f"{sorted(RUN_KEYS)}; finished: {sorted(FINISHED_KEYS)})")
        if not kind_ok(holder[key], kind):
            raise ConfigError(f"{path}: {field!r} is {type(holder[key]).__name__} {holder[key]!r}, not "
                              f"{getattr(kind, '__name__', 'a number')}")
    if not (math.isfinite(record["wall_s"]) and record["wall_s"] >= 0):
        raise ConfigError(f"{path}: 'wall_s' is {record['wall_s']!r}; a wall time is a finite number >= 0")
    return record


def run_records(out: Path, scores: bool = False, under: str = "runs",
                windows: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Folder name -> record, for every ``runs/<name>/run.json`` of ``out`` (``under``: another subfolder, e.g.
    :data:`ASIDE_DIR`) that can be read, in name order (one that cannot be read as JSON is no record: its run counts
    as not run, as after a write that was cut short). A record that reads but lacks a field is refused
    (:func:`check_record`, with ``scores`` for the tables): its numbers would be guesses. What a record predates is
    taken from the folder's timeline (:func:`cpu_timeline`), or from ``windows`` in its place (a timeline tried
    before it is written)."""
    found = {path.parent.name: (path, read_json(path)) for path in sorted(Path(out).glob(f"{under}/*/{RUN_FILE}"))}
    records = {name: check_record(path, record, scores) for name, (path, record) in found.items() if record}
    windows = cpu_timeline(out) if windows is None else windows
    for name, record in records.items():  # what a record predates (its CPU, its signature): the folder's timeline
        executor = record.get("executor") if isinstance(record.get("executor"), dict) else {}
        window = _window(windows, record) if windows else None
        if window is None:
            continue
        if not run_cpu(record):
            record["executor"] = executor = {**executor, "cpu": window["cpu"], "cpu_from": CPU_TIMELINE,
                                             **({"avx512": window["avx512"]} if "avx512" in window else {})}
        if "signature" in window and not executor.get("cpu_signature"):
            theirs = (cpu_maker(run_cpu(record)), executor.get("avx512"))
            if theirs != (cpu_maker(window["cpu"]), window.get("avx512")):
                raise ConfigError(f"{Path(out) / CPU_TIMELINE}: the window of CPU signature {window['signature']!r} "
                                  f"({window['cpu']}, avx512 {window.get('avx512')}) holds {under}/{name}, made on "
                                  f"{run_cpu(record)} (avx512 {executor.get('avx512')}): narrow the window")
            record["executor"] = {**executor, "cpu_signature": window["signature"],
                                  "cpu_signature_from": CPU_TIMELINE}
    return records


def utc_time(moment: float | None = None) -> str:
    """A time (epoch seconds; now by default) as the records write one: ISO 8601 in UTC to the second
    (``2026-12-02T00:36:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


# ---------------------------------------------------------------------------------------------------- the protocol


def recorded_protocol(out: Path) -> tuple[dict[str, Any] | None, str]:
    """The folder's protocol settings and, when they do not come from ``sweep.json``, why: the file is missing or
    damaged and they were rebuilt from the runs (:func:`~feddg.benchmark.protocol.protocol_from_runs`). (None, "")
    for a folder with neither. ConfigError naming the file when it is missing or damaged and the runs cannot show
    the protocol."""
    path = Path(out) / SWEEP_FILE
    recorded = read_json(path)
    if all(isinstance(recorded.get(key), kind) for key, kind in PROTOCOL_KEYS.items()):
        return recorded, ""
    records = run_records(out)
    if not records:
        return None, ""
    state = "is damaged" if path.exists() else "is missing"
    try:
        protocol = protocol_from_runs(records)
    except ConfigError as e:
        raise ConfigError(f"{path} {state} and cannot be rebuilt from the folder's {len(records)} run(s): {e}; "
                          f"use another --out") from None
    return protocol.settings(), f"it {state}: rebuilt from the folder's {len(records)} run(s)"


def prepare_folder(out: Path, protocol: Protocol, report: Report = print, write: bool = True) -> None:
    """Create ``out`` with this protocol's ``sweep.json``, or check that the folder holds the same protocol
    (ConfigError naming the first differing setting and both values). A ``sweep.json`` rebuilt from the runs is
    written, with a note, only when this protocol is the same; its ``code_evidence`` and ``design`` are kept
    whenever they can be read. ``write=False`` (a dry run) checks and writes nothing."""
    path = Path(out) / SWEEP_FILE
    recorded, rebuilt = recorded_protocol(out)
    if recorded is not None:
        difference = protocol_difference(recorded, protocol)
        if difference:
            raise ConfigError(f"{path}{f' ({rebuilt})' if rebuilt else ''}: this results folder holds another "
                              f"protocol: {difference}; use another --out for another protocol")
    if not write or (recorded is not None and not rebuilt):
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in read_json(path).items() if k in KEPT_KEYS}
    if recorded is None:
        if path.exists():
            report(f"note: {path} is damaged and the folder holds no run: written for this sweep")
        write_json(path, {**protocol.settings(), **kept}, indent=2)
        return
    report(f"note: {path} {rebuilt}")
    write_json(path, {**recorded, "rebuilt_from_runs": utc_time(), **kept}, indent=2)


Design = dict[str, dict[str, list[int]]]  # method -> held-out site -> seeds: the cells asked for


def _design_of(recorded: dict[str, Any]) -> Design:
    """``sweep.json``'s ``design`` as method -> site -> seeds, whatever in it is malformed left out."""
    design = recorded.get("design")
    out: Design = {}
    for method, sites in (design.items() if isinstance(design, dict) else ()):
        for site, seeds in (sites.items() if isinstance(sites, dict) else ()):
            kept = [k for k in (seeds if isinstance(seeds, list) else []) if isinstance(k, int)
                    and not isinstance(k, bool)]
            if kept:
                out.setdefault(str(method), {})[str(site)] = kept
    return out


def record_design(out: Path, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int]) -> None:
    """Add the cells a sweep asks for (every method x held-out site x seed) to ``sweep.json``'s ``design``, the
    exact union of the cells the folder's sweeps asked for, as method -> site -> seeds in the order first asked.
    A folder without a design (made before it was kept, or whose ``sweep.json`` was rebuilt) starts it from the
    cells of its recorded runs. The tables show every designed method and site, a designed cell not run yet as
    "not run", and count the runs finished against the design. Called once the sweep is accepted (its protocol,
    records, executor and code), so a refused sweep leaves the design as it was."""
    path = Path(out) / SWEEP_FILE
    recorded = read_json(path)
    design = _design_of(recorded)
    if "design" not in recorded:
        for record in run_records(out).values():
            run = record.get("run") or {}
            if isinstance(run.get("seed"), int):
                _add(design, str(run.get("method")), str(run.get("held_out")), run["seed"])
    for method in methods:
        for site in held_out:
            for seed in seeds:
                _add(design, method, site, seed)
    if "design" not in recorded or design != _design_of(recorded):
        write_json(path, {**recorded, "design": design}, indent=2)


def _add(design: Design, method: str, site: str, seed: int) -> None:
    cell = design.setdefault(method, {}).setdefault(site, [])
    if seed not in cell:
        cell.append(seed)


def designed(out: Path) -> Design:
    """``sweep.json``'s ``design``: method -> held-out site -> seeds (empty for a folder without one)."""
    return _design_of(read_json(Path(out) / SWEEP_FILE))


# ------------------------------------------------------------------------------------------------------ the runs


def run_family(record: dict[str, Any]) -> str:
    """What a run's numbers repeat on (:func:`feddg.numerics.numbers_family`): its CPU's maker (:func:`run_cpu`),
    the kernels of its ``cpu_pin`` (``off`` for runs from before it was kept) on that CPU (``executor.avx512``) and
    the CPU's generation and caches (``executor.cpu_signature``), each from the folder's :data:`CPU_TIMELINE` where
    the record predates it."""
    executor = record.get("executor") or {}
    avx512, signature = executor.get("avx512"), executor.get("cpu_signature")
    return numbers_family(run_cpu(record), record.get("cpu_pin", "off"), avx512 if isinstance(avx512, bool) else None,
                          signature if isinstance(signature, str) and signature else None)


def seed_families(records: Iterable[dict[str, Any]]) -> dict[int, str]:
    """Seed -> the numbers family that holds it: the most common known family among its finished runs (ties: the
    first by name), for every seed with one. A seed's runs are compared pair by pair (method against baseline at
    each site), so they must all come from this family; another seed may come from another."""
    counts: dict[int, Counter] = {}
    for record in finished(records):
        family = run_family(record)
        if family != "unknown":
            counts.setdefault(int(record["run"]["seed"]), Counter())[family] += 1
    return {seed: min(c, key=lambda f: (-c[f], f)) for seed, c in sorted(counts.items())}


def check_records(out: Path, protocol: Protocol, move_aside: bool = False, report: Report = print,
                  write: bool = True) -> None:
    """Refuse a folder holding a run that is not a run of ``protocol`` (its folder name, task, simulator flags and
    config checked by :func:`~feddg.benchmark.protocol.run_mismatch`), or a run made on another numbers family than
    its seed's (:func:`seed_families`: a pair across CPU makers or kernels would compare the CPU, not the methods; a
    run whose record cannot tell is let be): ConfigError naming the run and its first differing setting with both
    values. With ``move_aside`` such runs are moved to ``OUT/aside/`` instead, each with a line; ``write=False`` (a
    dry run) only says what would be moved."""
    records = run_records(out)
    owners = seed_families(records.values())

    def mismatch(name: str, record: dict[str, Any]) -> str | None:
        why = run_mismatch(protocol, name, record)
        theirs, seed = run_family(record), record.get("run", {}).get("seed")
        owner = owners.get(seed) if isinstance(seed, int) else None
        if why is None and theirs != "unknown" and owner is not None and theirs != owner:
            why = (f"made on {theirs} (cpu_pin {record.get('cpu_pin', 'off')!r} on "
                   f"{run_cpu(record) or 'an unrecorded CPU'}), while seed {seed}'s runs are {owner}: a pair's two "
                   f"runs must come from one CPU family (feddg.numerics.numbers_family)")
        return why

    mismatched = {name: why for name, record in records.items() if (why := mismatch(name, record))}
    if not mismatched:
        return
    if not move_aside:
        name, why = next(iter(mismatched.items()))
        raise ConfigError(f"{out}: {len(mismatched)} run(s) were not made under this folder's protocol, first "
                          f"{name}: {why}; use another --out, or --move-aside-mismatched to move them to "
                          f"{Path(out) / ASIDE_DIR}")
    for name, why in mismatched.items():
        if not write:
            report(f"would move {name} to {ASIDE_DIR}/ ({why})")
            continue
        target = _free_name(Path(out) / ASIDE_DIR / name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(out) / "runs" / name), target)
        report(f"moved {name} to {target} ({why})")


def _free_name(path: Path) -> Path:
    """``path``, or ``path.2``, ``path.3``, ... : the first that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


# ------------------------------------------------------------------------------------------------------ the lock


@contextmanager
def folder_lock(out: Path, report: Report = print) -> Iterator[None]:
    """Hold ``out/.sweep.lock`` (this process's pid and host) for the block; the folder must exist. ConfigError
    naming the holder when another sweep that still runs (or one on another host, which cannot be checked) holds
    it; a lock left by a process of this host that no longer runs is taken over with a note. Released on every way
    out of the block."""
    path = Path(out) / LOCK_FILE
    with _exclusive(Path(out)):  # two sweeps starting together: one takes the lock, the other sees it taken
        holder = read_json(path) if path.exists() else None
        if holder is not None:
            refusal = _refusal(path, holder)
            if refusal:
                raise ConfigError(refusal)
            report(f"note: {path} was left by pid {holder['pid']} on {holder['host']}, which no longer runs; "
                   f"taking it over")
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": utc_time()}
        write_json(path, mine)
    try:
        yield
    finally:
        if read_json(path) == mine:
            path.unlink(missing_ok=True)


@contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _refusal(path: Path, holder: dict[str, Any]) -> str | None:
    """Why the lock ``holder`` (the content of ``path``) keeps this sweep out, or None when it may be taken over
    (its process, on this host, no longer runs)."""
    from feddg.process_tree import alive

    pid, host = holder.get("pid"), holder.get("host")
    where = f"{path.parent} is in use by another sweep (pid {pid} on host {host}, since {holder.get('since')})"
    if not isinstance(pid, int) or not isinstance(host, str):
        return f"{path} cannot be read: a sweep may be working on {path.parent}; remove the file if none is"
    if host != socket.gethostname():
        return f"{where}; its process cannot be checked from here: remove {path} if that sweep has ended"
    if alive(pid):
        return f"{where}: one sweep works on a folder at a time; wait for it to end, or stop it"
    return None
