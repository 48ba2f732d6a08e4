"""Does a run repeat bit for bit on this machine's CPU family? Two tiny jobs (fundus and prostate FedAvg, one round
of one epoch at 32 px), run with the benchmark's CPU numerics (``feddg.benchmark.cells.SWEEP_CPU_PIN``): the
SHA-256 of the final global model's weights and every per-case score, written as a reference with the CPU that made
them and its numbers family (:func:`feddg.numerics.numbers_family`: the CPU's maker, kernels, generation and
caches), and re-run and compared on any machine. The references written before the CPU's generation and caches were
recorded (no ``signature``) name a maker and kernels only: two AMD EPYC machines without AVX-512 did not repeat each
other's prostate runs (docs/benchmark.md), so such a reference is checked for information only.

    python benchmarks/cpu_reference.py --write      # this machine's reference: benchmarks/results/cpu_reference/
    python benchmarks/cpu_reference.py --check      # re-run here, compare with the reference of this family
    python benchmarks/cpu_reference.py --cost --repeats 3   # pinned (avx2) vs unpinned here, side by side

A run repeats on its family only: an Intel Xeon, even pinned to AVX2, re-ran two AMD EPYC prostate protocol runs
with other numbers (``benchmarks/results/cpu_check_prostate``), so ``--check`` compares strictly with the reference
of this machine's family and reports the others for information. The weights are what a short run proves: one
round leaves the per-case scores of a pinned and an unpinned run on an AVX-512 machine identical (their thresholded
masks agree) while the weights differ (``--cost`` on an Intel Xeon, 2026-11-28). A code change that moves the
numbers makes every reference stale: write them again (``--write``) on each family, as a results folder's
reproduce check would refuse such a change anyway. Exit status: 0 identical (or written), 1 a reference of this
family differs, 2 an error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from feddg.benchmark.cells import SWEEP_CPU_PIN
from feddg.benchmark.launch import SERVER_RUN
from feddg.benchmark.protocol import first_difference
from feddg.benchmark.reproduce import case_scores_of
from feddg.numerics import (CPU_PIN_MODES, cpu_model, cpu_signature, has_avx512, host_family, numbers_family,
                            pinned_environment)
from feddg.report import REPORT_FILE, code_fingerprint, script_command
from feddg.resume import CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "benchmarks" / "results" / "cpu_reference"
PIN = SWEEP_CPU_PIN  # the references are made as the benchmark makes its runs
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
    return "avx512" if has_avx512() else "avx2"


def family_here(pin: str = PIN) -> str:
    """This machine's numbers family for runs made with ``pin`` (:func:`feddg.numerics.host_family`)."""
    return host_family(pin)


def reference_path(family: str) -> Path:
    """Where the reference of ``family`` lives: ``AMD avx2`` -> ``cpu_reference/AMD-avx2.json``, ``AMD avx2 [23/49
    L1d 32K L2 512K L3 16M]`` -> ``cpu_reference/AMD-avx2-23-49-L1d-32K-L2-512K-L3-16M.json``."""
    return REFERENCES / f"{'-'.join(re.findall(r'[A-Za-z0-9.]+', family))}.json"


def weights_digest(checkpoint: Path) -> str:
    """SHA-256 over a saved global model's weights: every parameter's name and raw bytes, in name order."""
    import hashlib

    import numpy as np

    from feddg.inference import read_checkpoint

    digest = hashlib.sha256()
    for name, tensor in sorted(read_checkpoint(checkpoint).model.state_dict().items()):
        digest.update(name.encode() + b"\0" + np.ascontiguousarray(tensor.detach().cpu().numpy()).tobytes())
    return digest.hexdigest()


def run_job(job: str, overrides: list[str], workdir: Path, pin: str = PIN) -> dict[str, Any]:
    """``{"weights": digest of the final global model, "scores": per-case scores}`` of ``job`` with ``overrides``,
    run by ``feddg simulate`` in ``workdir`` with the CPU pin ``pin``; RuntimeError naming the job and the log's
    tail when it fails or runs past :data:`TIMEOUT_S`."""
    workspace = workdir / f"{job}_{pin}_ws"
    command = [sys.executable, "-m", "feddg.cli", "simulate", str(ROOT / "jobs" / job), "-w", str(workspace)]
    for assignment in overrides:
        command += ["--set", assignment]
    variables = {k for mode in CPU_PIN_MODES for k in pinned_environment(mode)}
    env = {**{k: v for k, v in os.environ.items() if k not in variables}, **pinned_environment(pin)}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{job}: the run took over {TIMEOUT_S} s") from None
    report = workspace / SERVER_RUN / REPORT_FILE
    if done.returncode != 0 or not report.exists():
        raise RuntimeError(f"{job}: exit {done.returncode}, no report; log tail:\n{(done.stdout + done.stderr)[-2000:]}")
    return {"weights": weights_digest(workspace / SERVER_RUN / "app_server" / CHECKPOINT),
            "scores": case_scores_of(json.loads(report.read_text()))}


def measure(workdir: Path) -> dict[str, Any]:
    """This machine's reference: every job's per-case scores and what made them."""
    return {"cpu": cpu_model(), "cpu_kind": cpu_kind(), "cpu_pin": PIN, "signature": cpu_signature(),
            "family": family_here(),
            "code": code_fingerprint(),
            "command": "python benchmarks/cpu_reference.py --write",
            "jobs": {job: {"overrides": overrides, **run_job(job, overrides, workdir)}
                     for job, overrides in JOBS.items()}}


def cost(workdir: Path, repeats: int) -> str:
    """Pinned and unpinned runs of every job, alternating, ``repeats`` times each, on this machine: a markdown table
    of the median wall times, their ratio, and whether the two give identical weights and per-case scores (on an
    AVX2-only machine both must be; on an AVX-512 one differing weights show that the pin changes the kernels)."""
    import statistics
    import time

    rows = ["| job | unpinned (s) | pinned avx2 (s) | pinned / unpinned | final weights | per-case scores |",
            "|---|---|---|---|---|---|"]
    for job, overrides in JOBS.items():
        times: dict[str, list[float]] = {"off": [], "avx2": []}
        results: dict[str, Any] = {}
        for _ in range(repeats):
            for pin in ("off", "avx2"):
                started = time.perf_counter()
                results[pin] = run_job(job, overrides, workdir, pin)
                times[pin].append(time.perf_counter() - started)
        off, on = statistics.median(times["off"]), statistics.median(times["avx2"])
        same = first_difference(results["off"]["scores"], results["avx2"]["scores"])
        weights = "identical" if results["off"]["weights"] == results["avx2"]["weights"] else "differ"
        rows.append(f"| {job} | {off:.1f} | {on:.1f} | {on / off:.2f} | {weights} | "
                    f"{'identical' if same is None else 'differ: ' + same.describe('unpinned', 'pinned')} |")
    return "\n".join(rows)


def read_reference(path: Path) -> dict[str, Any]:
    """A reference file, checked: ValueError naming the file and the field when it is not one (another task's or an
    edited one: jobs and overrides must be this script's)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e})") from None
    for key, kind in (("cpu", str), ("cpu_kind", str), ("cpu_pin", str), ("family", str), ("code", str),
                      ("jobs", dict)):
        if not isinstance(data.get(key) if isinstance(data, dict) else None, kind):
            raise ValueError(f"{path}: no {key!r} ({kind.__name__})")
    if data["cpu_pin"] not in CPU_PIN_MODES:
        raise ValueError(f"{path}: 'cpu_pin' is {data['cpu_pin']!r}, not one of {', '.join(CPU_PIN_MODES)}")
    signature = data.get("signature")  # absent in a reference written before signatures were recorded
    if signature is not None and not (isinstance(signature, str) and signature.strip()):
        raise ValueError(f"{path}: 'signature' is {signature!r}, not a CPU signature (feddg.numerics.cpu_signature)")
    family = numbers_family(data["cpu"], data["cpu_pin"], data["cpu_kind"] == "avx512", signature)
    if data["family"] != family:
        raise ValueError(f"{path}: 'family' is {data['family']!r}, but its cpu, cpu_kind, cpu_pin and signature make "
                         f"{family!r}")
    for job, entry in data["jobs"].items():
        if job not in JOBS or not isinstance(entry, dict) or entry.get("overrides") != JOBS[job]:
            raise ValueError(f"{path}: jobs.{job} is not one of this script's jobs with its overrides "
                             f"({sorted(JOBS)})")
        if not isinstance(entry.get("scores"), dict) or not entry["scores"]:
            raise ValueError(f"{path}: jobs.{job}.scores holds no per-case scores")
        weights = entry.get("weights")  # absent in a reference written before the weights were recorded
        if weights is not None and not (isinstance(weights, str) and len(weights) == 64
                                        and all(c in "0123456789abcdef" for c in weights)):
            raise ValueError(f"{path}: jobs.{job}.weights is not a SHA-256 hex digest")
    return data


def compare(reference: dict[str, Any], measured: dict[str, Any]) -> str | None:
    """The first difference, None when there is none: per job, the final weights' digest (when the reference has
    one) and then the first per-case score that differs (job, key, both values)."""
    for job, expected in reference["jobs"].items():
        here = measured["jobs"][job]
        if expected.get("weights") is not None and expected["weights"] != here["weights"]:
            return (f"{job}: the final global model's weights differ (SHA-256 {expected['weights'][:12]} in the "
                    f"reference, {here['weights'][:12]} here)")
        found = first_difference(expected["scores"], here["scores"])
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
              + script_command("benchmarks/cpu_reference.py", argv))
        return 0
    try:
        references = {p: read_reference(p) for p in sorted(REFERENCES.glob("*.json"))} if args.check else {}
        with tempfile.TemporaryDirectory() as tmp:
            measured = measure(Path(tmp))
    except (ValueError, RuntimeError) as e:
        print(f"cpu_reference: {e}", file=sys.stderr)
        return 2
    if args.write:
        path = reference_path(measured["family"])
        theirs = json.loads(path.read_text()).get("signature") if path.exists() else None
        if theirs and theirs != measured["signature"]:  # a family of several signatures (numerics.SAME_NUMBERS)
            print(f"cpu_reference: {path} is the reference of {measured['family']}, made on {theirs}; this machine "
                  f"({measured['signature']}) joins that family by measurement: check it with --check, not "
                  "--write", file=sys.stderr)
            return 2
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({measured['cpu']}, {measured['family']}, code {measured['code'][:12]})")
        return 0
    status = 0
    if not any(r["family"] == measured["family"] for r in references.values()):
        print(f"no reference of this machine's family ({measured['family']}): write one with --write")
    for path, reference in references.items():
        difference = compare(reference, measured)
        where = f"{path.name} (made on {reference['cpu']}, {reference['family']}) re-run on {measured['cpu']} " \
                f"({measured['family']})"
        checked = "the final weights and every per-case score" if all(
            e.get("weights") for e in reference["jobs"].values()) else "every per-case score (no weights recorded)"
        outcome = f"DIFFERS, {difference}" if difference else f"identical in {checked}"
        if reference["family"] != measured["family"]:
            print(f"{where}: another CPU family, not expected to repeat here; for information: {outcome}")
            continue
        print(f"{where}: {outcome}")
        status = max(status, 1 if difference else 0)
    print("command: " + script_command("benchmarks/cpu_reference.py", argv))
    return status


if __name__ == "__main__":
    sys.exit(main())
