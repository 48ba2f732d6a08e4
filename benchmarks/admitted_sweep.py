"""A sweep with a results folder's admitted code (an older commit) and this checkout's simulator fixes: how the
prostate set goes on while main's code is not admitted into its families (docs/benchmark.md, "CPU numerics").

    python benchmarks/admitted_sweep.py --commit beb898b -- --task prostate \\
        --out benchmarks/results/loso_prostate_seeds --methods fedavg,uniform --held-out HK --seeds 6 --parallel 2
    python benchmarks/admitted_sweep.py --commit beb898b -- --task prostate --out /tmp/probe \\
        --methods fedavg --held-out BIDMC --seeds 6 --set train.rounds=3      # the 3-round probe of a machine

Everything after ``--`` is ``feddg benchmark``'s arguments, run as ``python -m feddg.cli benchmark`` of the commit:
from a git worktree of it (``--worktree``, made when missing; an existing one is used only when it is at that commit
with no change and no file git does not ignore), with that worktree's package first on ``PYTHONPATH``, so the runs
record the commit's code fingerprint. A relative ``--out`` or ``--data-root`` is taken from the folder this script
is started in; the sweep runs in the worktree, so ``feddg benchmark``'s checks of ``--out`` against the current
folder and the committed ``jobs/`` are the worktree's. NVFlare's simulator process
gets this checkout's ``custom/feddg/flare/simulator.py`` (``benchmarks/admitted_code/sitecustomize.py``): its fixes
of the site-name and port races, which are newer than the admitted code and change which name and port each site's
worker gets, nothing a run computes. The process is replaced by the sweep's, so a signal (SIGINT to pause) reaches
the sweep itself.

The admitted code's sweep rewrites the folder's tables after each run in that code's format; before they are
committed, ``feddg benchmark --task TASK --out FOLDER --tables-only`` (this checkout's code) writes them again from
the same runs in the current one, running nothing.

The admitted code predates the CPU signature in run records: after the runs, the session gives its machine's
signature to them with a window in the folder's ``cpu_timeline.json`` (``benchmarks/cpu_window.py``), only when the
probe repeated a run of the family it joins (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
SHIM = Path(__file__).resolve().parent / "admitted_code"
FIXES_ENV = "FEDDG_SIMULATOR_FIXES"  # read by admitted_code/sitecustomize.py


PATH_OPTIONS = ("--out", "--data-root")  # feddg benchmark's folder options, made absolute (the sweep runs elsewhere)


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s output; SystemExit with git's own message when it fails."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} in {repo}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout.strip()


def commit_of(repo: Path, rev: str) -> str:
    """The full commit ``rev`` names in ``repo``; SystemExit naming it when there is none."""
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--commit {rev}: no such commit in {repo}")
    return done.stdout.strip()


def worktree_at(repo: Path, commit: str, path: Path) -> Path:
    """A git worktree of ``repo`` at ``commit`` in ``path``: made when ``path`` does not exist; an existing one is
    used only when it is a work tree at ``commit`` with no local change (SystemExit naming what differs otherwise,
    and nothing is touched)."""
    if path.exists():
        if not (path / ".git").exists():
            raise SystemExit(f"--worktree {path}: exists and is not a git worktree; name another folder")
        head = git(path, "rev-parse", "HEAD")
        if head != commit:
            raise SystemExit(f"--worktree {path}: is at {head[:12]}, not {commit[:12]}; name another folder")
        if git(path, "status", "--porcelain", "--untracked-files=all"):  # ignored files (caches) do not count
            raise SystemExit(f"--worktree {path}: has local changes or files git does not ignore; its runs would not "
                             "be the commit's code alone")
        return path
    git(repo, "worktree", "prune")  # a worktree of that name removed by hand is registered still
    git(repo, "worktree", "add", "--detach", str(path), commit)
    return path


def absolute_paths(args: list[str], start: Path) -> list[str]:
    """``feddg benchmark``'s arguments with the folders of :data:`PATH_OPTIONS` made absolute from ``start`` (the
    sweep runs in the worktree; any other relative path in them is the worktree's). SystemExit for an abbreviated
    one (``--ou``), which argparse would take and this would miss."""
    out = list(args)
    for i, arg in enumerate(out):
        name, eq, value = arg.partition("=")
        if name in PATH_OPTIONS:
            if eq:
                out[i] = f"{name}={(start / value).resolve()}"
            elif i + 1 < len(out):
                out[i + 1] = str((start / out[i + 1]).resolve())
        elif len(name) > 2 and name.startswith("--") and any(o.startswith(name) for o in PATH_OPTIONS):
            raise SystemExit(f"{name}: give {' or '.join(o for o in PATH_OPTIONS if o.startswith(name))} in full")
    return out


def sweep_environment(worktree: Path, environ: dict[str, str]) -> dict[str, str]:
    """The sweep's environment: the worktree's package, then the shim, before any ``PYTHONPATH`` there was, and the
    fixes the shim loads."""
    paths = [str(worktree / "custom"), str(SHIM)] + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else [])
    return {**environ, "PYTHONPATH": os.pathsep.join(paths),
            FIXES_ENV: str(REPOSITORY / "custom" / "feddg" / "flare" / "simulator.py")}


def absolute(text: str) -> Path:
    """A path option, absolute from where the script is started (git and the sweep run elsewhere)."""
    return Path(text).expanduser().resolve()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, benchmark = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s --commit REV [--worktree DIR] -- FEDDG_BENCHMARK_ARGS")
    parser.add_argument("--commit", required=True, help="the admitted code's commit (the set's: beb898b)")
    parser.add_argument("--worktree", type=absolute, help="where its worktree is (default: the temp folder's "
                                                          "feddg-admitted-<commit>)")
    parser.add_argument("--repo", type=absolute, default=REPOSITORY, help="the repository holding the commit "
                                                                          "(default: this checkout)")
    args = parser.parse_args(ours)
    if not benchmark:
        parser.error("give feddg benchmark's arguments after --")
    commit = commit_of(args.repo, args.commit)
    worktree = worktree_at(args.repo, commit,
                           args.worktree or Path(tempfile.gettempdir()) / f"feddg-admitted-{commit[:12]}")
    command = [sys.executable, "-m", "feddg.cli", "benchmark", *absolute_paths(benchmark, Path.cwd())]
    print(f"admitted code {commit[:12]} from {worktree}: {shlex.join(command[1:])}", flush=True)
    os.chdir(worktree)
    os.execvpe(command[0], command, sweep_environment(worktree, dict(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
