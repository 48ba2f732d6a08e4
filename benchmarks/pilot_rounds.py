"""The pilot that chooses the sweep's number of rounds: FedAvg's mean validation Dice per round at one local epoch a
round, run long, and the round after which the last 20 % of rounds gain less than a threshold.

    python benchmarks/pilot_rounds.py --task prostate [--rounds 100] [--held-out RUNMC,HK] [--seeds 0]
                                      [--local-epochs 1] [--gain 0.01] [--out benchmarks/results/pilot_rounds]

Each run is a leave-one-site-out cell of the sweep (:mod:`feddg.benchmark.sweep`, the same job, seeds and simulator)
with ``train.rounds = --rounds`` and ``train.local_epochs = --local-epochs``; its record (with every round's
validation Dice and the wall time) is written to ``OUT/<task>/runs/<id>/run.json`` as soon as it finishes (a pilot
that is stopped resumes from there). The curve is the mean over the pilot's runs of the training sites' mean
validation Dice of the model each round received; its envelope ``c`` (the best so far of the 5-round trailing mean)
removes the round-to-round noise. The chosen number of rounds is the smallest ``R`` such that every run length from
``R`` to the pilot's own gains less than ``gain`` in its last fifth, ``c[R'-1] - c[ceil(0.8 R') - 1] < gain`` (an
early plateau that the curve leaves again does not count). Writes ``OUT/<task>/pilot.json`` (every number, the
command, the machine) and ``pilot.md`` / ``pilot.png`` made from it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from feddg.benchmark.sweep import Protocol, parse_seeds, sweep
from feddg.jsonfile import read_json, write_json
from feddg.folders import guard_folder
from feddg.numbers import finite, seconds
from feddg.report import machine_info, script_command, software_versions


SMOOTHING = 5  # rounds of the trailing mean under the envelope


def envelope(curve: np.ndarray, window: int = SMOOTHING) -> np.ndarray:
    """The best-so-far value of the trailing ``window``-round mean of ``curve`` (round by round): the mean keeps
    one lucky round (prostate validation Dice jumps by 0.03 between neighbouring rounds) from setting the level,
    the best-so-far keeps a dip from undoing it."""
    c = np.asarray(curve, dtype=float)
    cumulative = np.concatenate([[0.0], np.cumsum(c)])
    starts = np.maximum(np.arange(len(c)) - window + 1, 0)
    trailing = (cumulative[1:] - cumulative[starts]) / (np.arange(len(c)) - starts + 1)
    return np.maximum.accumulate(trailing)


def last_fifth_gain(curve: np.ndarray, rounds: int, window: int = SMOOTHING) -> float:
    """What the last fifth of ``rounds`` rounds gains on the envelope of ``curve``."""
    c = envelope(np.asarray(curve, dtype=float), window)
    return float(c[rounds - 1] - c[math.ceil(0.8 * rounds) - 1])


def chosen_rounds(curve: np.ndarray, gain: float, window: int = SMOOTHING) -> int | None:
    """The smallest ``R`` from which on every run length up to the pilot's own gains less than ``gain`` in its last
    fifth (on the envelope of ``curve``): a plateau that the curve later leaves is not taken for convergence (the
    fundus pilot's validation Dice rests at 0.46 for rounds 2-8, the disc learned, before the cup is). None when
    the whole pilot still gains ``gain`` or more in its last fifth: run it longer. ``R >= 5``, so that a fifth of
    it is at least one round."""
    n = len(curve)
    if n < 5 or last_fifth_gain(curve, n, window) >= gain:
        return None
    r = n
    while r > 5 and last_fifth_gain(curve, r - 1, window) < gain:
        r -= 1
    return r


def mean_curve(records: list[dict[str, Any]]) -> np.ndarray:
    """(rounds,) the mean over runs of each round's mean validation Dice (the runs' common length)."""
    curves = [[h["mean_val_dice"] for h in r["report"]["history"]] for r in records if r.get("status") == "ok"]
    if not curves:
        raise ValueError("no finished pilot run to read a curve from")
    n = min(map(len, curves))
    return np.mean([c[:n] for c in curves], axis=0)


def summarise(task: str, records: list[dict[str, Any]], gain: float, command: str) -> dict[str, Any]:
    curve = mean_curve(records)
    ok = [r for r in records if r.get("status") == "ok"]
    per_round = [r["wall_s"] / len(r["report"]["history"]) for r in ok]
    chosen = chosen_rounds(curve, gain)
    return {"task": task, "command": command, "gain": gain, "chosen_rounds": chosen,
            "curve": [float(v) for v in curve], "envelope": [float(v) for v in envelope(curve)],
            "runs": [{"run_id": r["run_id"], "wall_s": r["wall_s"], "rounds": len(r["report"]["history"]),
                      "curve": [h["mean_val_dice"] for h in r["report"]["history"]]} for r in ok],
            "seconds_per_round": float(np.mean(per_round)),
            "seconds_per_run_at_chosen": None if chosen is None else float(np.mean(per_round)) * chosen,
            "machine": machine_info(), "versions": software_versions()}


def markdown(summary: dict[str, Any]) -> str:
    c, env = summary["curve"], summary["envelope"]
    chosen = summary["chosen_rounds"]
    lines = [f"# Rounds pilot: {summary['task']}", "", f"`{summary['command']}`", "",
             f"FedAvg, one local epoch per round; {len(summary['runs'])} run(s): "
             + ", ".join(f"{r['run_id']} ({r['wall_s']:.0f} s)" for r in summary["runs"])
             + f". {summary['seconds_per_round']:.2f} s per round on {summary['machine'].get('cpu', '?')}.", ""]
    if chosen is None:
        lines.append(f"Still gaining {summary['gain']} or more in the last fifth of all {len(c)} rounds: run longer.")
    else:
        low = math.ceil(0.8 * chosen) - 1
        lines.append(f"Chosen: **{chosen} rounds** (best-so-far mean validation Dice {env[low]:.3f} at round {low} "
                     f"-> {env[chosen - 1]:.3f} at round {chosen - 1}, a gain below {summary['gain']}); about "
                     f"{summary['seconds_per_run_at_chosen']:.0f} s per run.")
    lines += ["", "| round | mean validation Dice | best so far |", "|---|---|---|"]
    step = max(1, len(c) // 25)
    lines += [f"| {i} | {c[i]:.3f} | {env[i]:.3f} |" for i in range(0, len(c), step)]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in summary["runs"]:
        ax.plot(r["curve"], alpha=0.4, label=r["run_id"])
    ax.plot(summary["curve"], color="black", label="mean")
    if summary["chosen_rounds"]:
        ax.axvline(summary["chosen_rounds"] - 1, linestyle="--", color="gray", label="chosen")
    ax.set(xlabel="round", ylabel="mean validation Dice", title=f"Rounds pilot: {summary['task']} (FedAvg)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=["prostate", "fundus"])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--held-out", help="comma-separated held-out sites (default: the job's)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--gain", type=finite, default=0.01)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--run-timeout", type=seconds, default=3600)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pilot_rounds"))
    args = parser.parse_args(argv)
    from feddg.experiment import TASK_DEFAULTS, merge, parse_overrides

    if args.rounds < 5:
        parser.error("--rounds must be at least 5 (a fifth of the rounds must be a round)")
    overrides = merge(parse_overrides(args.overrides),
                      {"train": {"rounds": args.rounds, "local_epochs": args.local_epochs}})
    held_out = args.held_out.split(",") if args.held_out else [TASK_DEFAULTS[args.task]["data"]["unseen_site"]]
    try:
        guard_folder(args.out, "--out", whole=False)  # where the task's folder goes
        out = guard_folder(args.out / args.task, "--out (its <task> folder)")  # a sweep's results folder
    except ValueError as e:
        parser.error(str(e))
    command = script_command("benchmarks/pilot_rounds.py", argv)
    records = sweep(out, Protocol(args.task, overrides), ["fedavg"], held_out, parse_seeds(args.seeds),
                    timeout=args.run_timeout, report=lambda line: print(line, flush=True))
    summary = summarise(args.task, records, args.gain, command)
    write_json(out / "pilot.json", summary, indent=1, finite=True)  # the raw numbers first, then what is made from them
    (out / "pilot.md").write_text(markdown(read_json(out / "pilot.json")))
    plot(summary, out / "pilot.png")
    print((out / "pilot.md").read_text())
    return 0 if all(r.get("status") == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
