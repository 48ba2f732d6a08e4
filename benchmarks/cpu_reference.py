"""Does a pinned run repeat bit for bit on this machine? The per-case scores of two tiny jobs (fundus and prostate
FedAvg, one round of one epoch at 32 px), run with ``FEDDG_CPU_PIN=avx2`` (:mod:`feddg.numerics`), written as a
reference with the CPU that made them, and re-run and compared on any machine.

    python benchmarks/cpu_reference.py --write      # this machine's reference: benchmarks/results/cpu_reference/
    python benchmarks/cpu_reference.py --check      # re-run every committed reference here, compare bit for bit
    python benchmarks/cpu_reference.py --cost --repeats 3   # pinned vs unpinned here, side by side: time, scores

A reference belongs to a CPU kind: ``avx2`` (no AVX-512: the AMD EPYC machines here) or ``avx512`` (the Intel
Xeon ones). On a machine of the reference's kind ``--check`` proves that a pinned run repeats; on the other kind
it is the proof the pin is for (AVX2 kernels on an AVX-512 machine giving the AVX2 machine's numbers), and a
difference there says the pin does not hold across kinds. A code change that moves the numbers makes every
reference stale: write them again (``--write``) on each kind, as a results folder's reproduce check would refuse
such a change anyway. Exit status: 0 identical (or written), 1 a reference differs, 2 an error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from feddg.benchmark.launch import SERVER_RUN
from feddg.benchmark.protocol import first_difference
from feddg.benchmark.sweep import case_scores_of
from feddg.numerics import cpu_flags, pinned_environment
from feddg.report import REPORT_FILE, code_fingerprint, cpu_model

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "benchmarks" / "results" / "cpu_reference"
PIN = "avx2"
TINY = ["train.rounds=1", "train.local_epochs=1", "train.batch_size=4", "data.image_size=32",
        "data.synthetic.size=32", "model.features=[8, 8, 16, 32, 64, 8]", "eval.batch_size=8"]
JOBS: dict[str, list[str]] = {
    "fundus_fedavg": [*TINY, "data.synthetic.cases_per_site=4"],
    "prostate_fedavg": [*TINY, "data.synthetic.cases_per_site=3", "data.synthetic.slices_per_case=4",
                        "data.sites=[BIDMC, BMC, RUNMC]"],
}
TIMEOUT_S = 600


def cpu_kind() -> str:
    """``avx512`` on a CPU with AVX-512, else ``avx2``: the kernel families an unpinned run takes."""
    return "avx512" if "avx512f" in cpu_flags() else "avx2"


def run_job(job: str, overrides: list[str], workdir: Path, pin: str = PIN) -> dict[str, Any]:
    """Per-case scores of ``job`` with ``overrides``, run by ``feddg simulate`` in ``workdir`` with the CPU pin
    ``pin``; RuntimeError naming the job and the log's tail when it fails or runs past :data:`TIMEOUT_S`."""
    workspace = workdir / f"{job}_{pin}_ws"
    command = [sys.executable, "-m", "feddg.cli", "simulate", str(ROOT / "jobs" / job), "-w", str(workspace)]
    for assignment in overrides:
        command += ["--set", assignment]
    env = {**{k: v for k, v in os.environ.items() if k not in pinned_environment(PIN)}, **pinned_environment(pin)}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{job}: the run took over {TIMEOUT_S} s") from None
    report = workspace / SERVER_RUN / REPORT_FILE
    if done.returncode != 0 or not report.exists():
        raise RuntimeError(f"{job}: exit {done.returncode}, no report; log tail:\n{(done.stdout + done.stderr)[-2000:]}")
    return case_scores_of(json.loads(report.read_text()))


def measure(workdir: Path) -> dict[str, Any]:
    """This machine's reference: every job's per-case scores and what made them."""
    return {"cpu": cpu_model(), "cpu_kind": cpu_kind(), "cpu_pin": PIN, "code": code_fingerprint(),
            "command": "python benchmarks/cpu_reference.py --write",
            "jobs": {job: {"overrides": overrides, "scores": run_job(job, overrides, workdir)}
                     for job, overrides in JOBS.items()}}


def cost(workdir: Path, repeats: int) -> str:
    """Pinned and unpinned runs of every job, alternating, ``repeats`` times each, on this machine: a markdown table
    of the median wall times, their ratio, and whether the two give identical per-case scores."""
    import statistics
    import time

    rows = ["| job | unpinned (s) | pinned avx2 (s) | pinned / unpinned | per-case scores |", "|---|---|---|---|---|"]
    for job, overrides in JOBS.items():
        times: dict[str, list[float]] = {"off": [], PIN: []}
        scores: dict[str, Any] = {}
        for _ in range(repeats):
            for pin in ("off", PIN):
                started = time.perf_counter()
                scores[pin] = run_job(job, overrides, workdir, pin)
                times[pin].append(time.perf_counter() - started)
        off, on = statistics.median(times["off"]), statistics.median(times[PIN])
        same = first_difference(scores["off"], scores[PIN])
        rows.append(f"| {job} | {off:.1f} | {on:.1f} | {on / off:.2f} | "
                    f"{'identical' if same is None else 'differ: ' + same.describe('unpinned', 'pinned')} |")
    return "\n".join(rows)


def read_reference(path: Path) -> dict[str, Any]:
    """A reference file, checked: ValueError naming the file and the field when it is not one (another task's or an
    edited one: jobs and overrides must be this script's)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e})") from None
    for key, kind in (("cpu", str), ("cpu_kind", str), ("cpu_pin", str), ("code", str), ("jobs", dict)):
        if not isinstance(data.get(key) if isinstance(data, dict) else None, kind):
            raise ValueError(f"{path}: no {key!r} ({kind.__name__})")
    if data["cpu_pin"] != PIN:
        raise ValueError(f"{path}: 'cpu_pin' is {data['cpu_pin']!r}, not {PIN!r}")
    for job, entry in data["jobs"].items():
        if job not in JOBS or not isinstance(entry, dict) or entry.get("overrides") != JOBS[job]:
            raise ValueError(f"{path}: jobs.{job} is not one of this script's jobs with its overrides "
                             f"({sorted(JOBS)})")
        if not isinstance(entry.get("scores"), dict) or not entry["scores"]:
            raise ValueError(f"{path}: jobs.{job}.scores holds no per-case scores")
    return data


def compare(reference: dict[str, Any], measured: dict[str, Any]) -> str | None:
    """The first per-case score that differs (job, key, both values), None when every one is identical."""
    for job in reference["jobs"]:
        found = first_difference(reference["jobs"][job]["scores"], measured["jobs"][job]["scores"])
        if found is not None:
            return f"{job}: {found.describe('in the reference', 'here')}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write this machine's reference")
    mode.add_argument("--check", action="store_true", help="re-run every committed reference and compare")
    mode.add_argument("--cost", action="store_true", help="time pinned against unpinned runs here, side by side")
    parser.add_argument("--repeats", type=int, default=3, help="--cost: runs of each kind per job (default 3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give 1 or more")
    if args.cost:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                table = cost(Path(tmp), args.repeats)
            except RuntimeError as e:
                print(f"cpu_reference: {e}", file=sys.stderr)
                return 2
        print(f"{cpu_model()} ({cpu_kind()}), {args.repeats} run(s) of each, alternating; median wall time of "
              f"`feddg simulate` (start-up included)\n\n{table}\n\ncommand: "
              + shlex.join(["python", "benchmarks/cpu_reference.py", *(argv if argv is not None else sys.argv[1:])]))
        return 0
    try:
        references = {p: read_reference(p) for p in sorted(REFERENCES.glob("*.json"))} if args.check else {}
        with tempfile.TemporaryDirectory() as tmp:
            measured = measure(Path(tmp))
    except (ValueError, RuntimeError) as e:
        print(f"cpu_reference: {e}", file=sys.stderr)
        return 2
    if args.write:
        REFERENCES.mkdir(parents=True, exist_ok=True)
        path = REFERENCES / f"{measured['cpu_kind']}.json"
        path.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({measured['cpu']}, code {measured['code'][:12]})")
        return 0
    status = 0
    for path, reference in references.items():
        difference = compare(reference, measured)
        where = f"{path.name} (made on {reference['cpu']}, {reference['cpu_kind']}) re-run on {measured['cpu']} " \
                f"({measured['cpu_kind']}), pinned {PIN}"
        print(f"{where}: " + (f"DIFFERS, {difference}" if difference else "identical in every per-case score"))
        status = max(status, 1 if difference else 0)
    print("command: " + shlex.join(["python", "benchmarks/cpu_reference.py", *(argv or sys.argv[1:])]))
    return status


if __name__ == "__main__":
    sys.exit(main())
