"""benchmarks/admitted_sweep.py and its shim: a sweep runs a commit's package from a worktree of it, and NVFlare's
simulator process gets this checkout's simulator fixes (real NVFlare runner module; a tiny git repository stands
in for the project's history)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.admitted_sweep import FIXES_ENV, SHIM
from tests.conftest import REPOSITORY

SCRIPT = REPOSITORY / "benchmarks" / "admitted_sweep.py"
FIXES = REPOSITORY / "custom" / "feddg" / "flare" / "simulator.py"  # this checkout's simulator fixes
RUNNER = "nvflare.private.fed.app.simulator.simulator_runner"

# The stand-in package's CLI: writes what it was run with into the --out folder.
FAKE_CLI = """import json, os, sys
from pathlib import Path
given = [a.partition("=")[2] for a in sys.argv if a.startswith("--out=")]
out = Path(given[0] if given else sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True)
(out / "seen.json").write_text(json.dumps({"version": VERSION, "argv": sys.argv[1:], "cwd": os.getcwd(),
    "pythonpath": os.environ["PYTHONPATH"], "fixes": os.environ.get("FEDDG_SIMULATOR_FIXES")}))
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@pytest.fixture
def history(tmp_path) -> tuple[Path, str, str]:
    """A repository whose package's CLI says version 1 in its first commit and 2 in its second."""
    repo = tmp_path / "repo"
    package = repo / "custom" / "feddg"
    package.mkdir(parents=True)
    _git(repo, "init", "-q")
    (package / "__init__.py").write_text("")
    commits = []
    for version in (1, 2):
        (package / "cli.py").write_text(f"VERSION = {version}\n{FAKE_CLI}")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"v{version}")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    return repo, commits[0], commits[1]


def _sweep(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_sweep_runs_the_commits_package_from_its_worktree_with_the_fixes_and_an_absolute_out(tmp_path,
                                                                                                 history):
    repo, first, _ = history
    worktree = tmp_path / "wt"
    done = _sweep(tmp_path, "--repo", str(repo), "--commit", first[:7], "--worktree", str(worktree), "--",
                  "--task", "prostate", "--out", "rel/out")
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "rel" / "out" / "seen.json").read_text())
    assert seen["version"] == 1, "the commit's code, not the repository's head"
    assert seen["argv"] == ["benchmark", "--task", "prostate", "--out", str(tmp_path / "rel" / "out")]
    assert Path(seen["cwd"]) == worktree.resolve()
    assert seen["pythonpath"].split(os.pathsep)[:2] == [str(worktree / "custom"), str(SHIM)]
    assert seen["fixes"] == str(FIXES)
    again = _sweep(tmp_path, "--repo", str(repo), "--commit", first, "--worktree", "wt", "--",
                   "--out=rel/again", "--data-root", "data")
    assert again.returncode == 0, again.stderr
    seen = json.loads((tmp_path / "rel/again/seen.json").read_text())
    assert seen["version"] == 1 and Path(seen["cwd"]) == worktree.resolve(), "a relative --worktree is the same one"
    assert seen["argv"] == ["benchmark", f"--out={tmp_path / 'rel' / 'again'}", "--data-root", str(tmp_path / "data")]
    abbreviated = _sweep(tmp_path, "--repo", str(repo), "--commit", first, "--worktree", "wt", "--", "--ou", "x")
    assert abbreviated.returncode != 0 and "give --out in full" in abbreviated.stderr
    assert not (tmp_path / "x").exists()


def test_a_worktree_at_another_commit_with_changes_or_not_one_is_refused_untouched(tmp_path, history):
    repo, first, second = history
    worktree = tmp_path / "wt"
    assert _sweep(tmp_path, "--repo", str(repo), "--commit", second, "--worktree", str(worktree), "--",
                  "--out", "a").returncode == 0
    refused = _sweep(tmp_path, "--repo", str(repo), "--commit", first, "--worktree", str(worktree), "--", "--out", "b")
    assert refused.returncode != 0 and f"is at {second[:12]}, not {first[:12]}" in refused.stderr
    (worktree / "custom" / "feddg" / "cli.py").write_text("changed")
    changed = _sweep(tmp_path, "--repo", str(repo), "--commit", second, "--worktree", str(worktree), "--",
                     "--out", "c")
    assert changed.returncode != 0 and "has local changes" in changed.stderr
    assert (worktree / "custom" / "feddg" / "cli.py").read_text() == "changed", "nothing touched"
    _git(worktree, "checkout", "--", ".")
    (worktree / "custom" / "feddg" / "extra.py").write_text("")  # code_fingerprint would count it
    added = _sweep(tmp_path, "--repo", str(repo), "--commit", second, "--worktree", str(worktree), "--",
                   "--out", "c")
    assert added.returncode != 0 and "files git does not ignore" in added.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "keep.txt").write_text("x")
    foreign = _sweep(tmp_path, "--repo", str(repo), "--commit", first, "--worktree", str(plain), "--", "--out", "d")
    assert foreign.returncode != 0 and "not a git worktree" in foreign.stderr
    assert [p.name for p in plain.iterdir()] == ["keep.txt"]
    unknown = _sweep(tmp_path, "--repo", str(repo), "--commit", "0" * 40, "--", "--out", "e")
    assert unknown.returncode != 0 and "no such commit" in unknown.stderr
    bare = _sweep(tmp_path, "--repo", str(repo), "--commit", first)
    assert bare.returncode != 0 and "after --" in bare.stderr
    assert not any((tmp_path / name).exists() for name in "bcde")


def _runner_in_a_process(environ: dict[str, str]) -> dict:
    code = (f"import json, sys, {RUNNER} as runner, nvflare.private.fed.app.deployer.simulator_deployer as deployer;"
            " print(json.dumps({'loaded': 'feddg_simulator_fixes' in sys.modules,"
            " 'runner_class': runner.SimulatorClientRunner.__module__,"
            " 'runner_ports': runner.get_open_ports.__module__, 'deployer_ports': deployer.get_open_ports.__module__}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**environ, "PYTHONPATH": str(SHIM)}, cwd=SHIM.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_shim_puts_the_checkouts_simulator_fixes_into_nvflares_runner_when_it_is_imported():
    environ = {k: v for k, v in os.environ.items() if k != FIXES_ENV}
    fixed = _runner_in_a_process({**environ, FIXES_ENV: str(FIXES)})
    assert fixed == {"loaded": True, "runner_class": "feddg_simulator_fixes", "runner_ports": "feddg_simulator_fixes",
                     "deployer_ports": "feddg_simulator_fixes"}
    plain = _runner_in_a_process(environ)
    assert plain["loaded"] is False and plain["runner_class"] == RUNNER, "without the variable it does nothing"
