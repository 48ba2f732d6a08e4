"""Nothing a user types deletes what they did not ask to delete (:mod:`feddg.folders`).

The guard's rules on their own, then every command that takes a folder, run as a user would run it inside a
throwaway copy of a checkout (a ``.git`` folder and a sentinel file): each must refuse in one line naming its
option, and both must survive. A table-driven test fails when a folder option is added anywhere without a row
here, i.e. without the guard.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from feddg.folders import COMMITTED_JOBS, MARKER, FolderRefused, claim, guard_folder, is_ours
from tests.conftest import REPOSITORY

JOB = REPOSITORY / "jobs" / "fundus_fedavg"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A throwaway stand-in for a user's checkout: a .git folder and an uncommitted file."""
    co = tmp_path / "fundus_fedavg"  # named like a job: the recipes' -w REPOSITORY puts the run in REPOSITORY/<job>
    (co / ".git").mkdir(parents=True)
    (co / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (co / "sentinel.txt").write_text("uncommitted work\n")
    return co


def survived(co: Path) -> bool:
    return (co / "sentinel.txt").read_text() == "uncommitted work\n" and (co / ".git" / "HEAD").is_file()


# ------------------------------------------------------------------------------------------------ the rules alone


@pytest.mark.parametrize("value, why", [
    ("", "is empty"),
    ("   ", "is empty"),
    (".", "is the current folder"),
    ("..", "holds the current folder"),
    ("~", "is your home folder"),
    ("/", "is the filesystem root"),
])
def test_places_never_handed_over(checkout, monkeypatch, value, why):
    monkeypatch.chdir(checkout / ".git")  # inside the checkout: "." and ".." are its folders
    with pytest.raises(FolderRefused, match=re.escape(why)) as e:
        guard_folder(value, "-w")
    assert str(e.value).startswith("-w") and "\n" not in str(e.value)


def test_git_work_tree_and_inside_dot_git(checkout, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FolderRefused, match="is a git work tree"):
        guard_folder(str(checkout), "--out")
    with pytest.raises(FolderRefused, match=r"is inside a \.git folder"):
        guard_folder(str(checkout / ".git" / "objects"), "--out")
    assert survived(checkout)


def test_committed_jobs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in (COMMITTED_JOBS, COMMITTED_JOBS / "fundus_fedavg", COMMITTED_JOBS / "new"):
        with pytest.raises(FolderRefused, match="committed"):
            guard_folder(str(path), "--out")
    assert guard_folder(str(COMMITTED_JOBS), "--out", whole=False, template_jobs=True) == COMMITTED_JOBS.resolve()


def test_a_folder_holding_or_inside_the_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "ws_job" / "fundus_fedavg"
    job.mkdir(parents=True)
    with pytest.raises(FolderRefused, match="holds this command's input"):
        guard_folder(str(tmp_path / "ws_job"), "-w", inputs=[job])
    with pytest.raises(FolderRefused, match="is inside this command's input"):
        guard_folder(str(job / "ws"), "-w", inputs=[job])
    with pytest.raises(FolderRefused, match="holds this command's input"):
        guard_folder(str(job), "-w", inputs=[job])


def test_non_empty_folders_only_when_ours(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("x")
    with pytest.raises(FolderRefused, match=f"was not made by feddg \\(no {re.escape(MARKER)}"):
        guard_folder(str(theirs), "--out")
    assert guard_folder(str(theirs), "--out", whole=False) == theirs  # adding named entries only
    empty, new = tmp_path / "empty", tmp_path / "new" / "deeper"
    empty.mkdir()
    assert guard_folder(str(empty), "--out") == empty and guard_folder(str(new), "--out") == new
    assert not new.exists()  # the guard creates nothing
    ours = claim(tmp_path / "ours", "a test")
    (ours / "old_run.txt").write_text("x")
    assert is_ours(ours) and guard_folder(str(ours), "--out") == ours
    kept = tmp_path / "ws"  # NVFlare's simulator keeps local/ when it clears its workspace: the marker goes there
    claim(kept, "a test", inside="local")
    (kept / "server").mkdir()
    assert is_ours(kept) and guard_folder(str(kept), "-w") == kept
    file = tmp_path / "a_file"
    file.write_text("x")
    with pytest.raises(FolderRefused, match="is a file"):
        guard_folder(str(file), "--out", whole=False)


# ---------------------------------------------------------------------------------- every command, as a user runs it


def _feddg(*args: str) -> list[str]:
    return [sys.executable, "-m", "feddg.cli", *args]


def _job_py(*args: str) -> list[str]:
    return [sys.executable, str(REPOSITORY / "job.py"), *args]


def _script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(REPOSITORY / "benchmarks" / name), *args]


# (file that declares the option, option) -> (the command with "{F}" for the folder, the option named in the
# refusal). Every folder option of the package and of benchmarks/ has a row: test_every_folder_option_is_guarded
# reads them from the source.
GUARDED = {
    ("custom/feddg/cli.py", "-w"): (_feddg("simulate", str(JOB), "-w", "{F}"), "-w"),
    ("custom/feddg/cli.py", "--out/benchmark"): (
        _feddg("benchmark", "--task", "fundus", "--methods", "fedavg", "--seeds", "0", "--out", "{F}"), "--out"),
    ("custom/feddg/cli.py", "--out/make-jobs"): (_feddg("make-jobs", "--out", "{F}", "fundus_fedavg"), "--out"),
    ("custom/feddg/cli.py", "--out/resume-job"): (
        _feddg("resume-job", str(JOB), "--from", "/nonexistent", "--out", "{F}"), "--out"),
    ("custom/feddg/cli.py", "--out/synth"): (_feddg("synth", "--task", "fundus", "--out", "{F}"), "--out"),
    ("custom/feddg/cli.py", "--out/segment"): (
        _feddg("segment", "--model", "/nonexistent.pt", "--out", "{F}", "scan.nii.gz"), "--out"),
    ("custom/feddg/cli.py", "--overlays"): (
        _feddg("evaluate", "--model", "/nonexistent.pt", "--data-root", "/nonexistent", "--sites", "Domain1",
               "--overlays", "{F}"), "--overlays"),
    ("custom/feddg/cli.py", "--workspace"): (_feddg("poc", str(JOB), "--workspace", "{F}"), "--workspace"),
    ("custom/feddg/poc.py", "--workspace"): (
        [sys.executable, "-m", "feddg.poc", str(JOB), "--workspace", "{F}"], "--workspace"),
    ("custom/feddg/rehearsal/options.py", "--workspace"): (
        _feddg("rehearse-network", str(JOB), "--workspace", "{F}"), "--workspace"),
    ("custom/feddg/recipes/main.py", "-w"): (_job_py("fundus_fedavg", "--env", "sim", "-w", "{F}"), "-w"),
    ("custom/feddg/recipes/main.py", "--workspace"): (
        _job_py("fundus_fedavg", "--env", "poc", "--workspace", "{F}"), "--workspace"),
    ("nvflare.recipe", "--export-dir"): (
        _job_py("fundus_fedavg", "--export", "--export-dir", "{F}"), "--export-dir"),
    ("benchmarks/round_time.py", "--out"): (_script("round_time.py", "--out", "{F}"), "--out"),
    ("benchmarks/round_layouts.py", "--out"): (_script("round_layouts.py", "--protocol", "fundus", "--out", "{F}"),
                                               "--out"),
    ("benchmarks/sweep_throughput.py", "--out"): (_script("sweep_throughput.py", "--out", "{F}"), "--out"),
    ("benchmarks/pilot_rounds.py", "--out"): (
        _script("pilot_rounds.py", "--task", "fundus", "--out", "{F}"), "--out"),
    ("benchmarks/same_cell.py", "--out"): (
        _script("same_cell.py", "a/run.json", "--label", "x", "--out", "{F}"), "--out"),
    ("benchmarks/ga_gaps.py", "--out"): (
        _script("ga_gaps.py", str(REPOSITORY / "benchmarks/results/loso_fundus_seeds"), "--out", "{F}"), "--out"),
    ("benchmarks/mask_volume.py", "--out"): (
        _script("mask_volume.py", str(REPOSITORY / "benchmarks/results/loso_prostate_seeds"), "--out", "{F}"), "--out"),
}
FOLDER_OPTION = re.compile(r"^(-w|--out|--workspace(-root)?|--overlays|--[a-z-]*-dir)$")


def declared_folder_options() -> set[tuple[str, str]]:
    """(file, option) of every ``add_argument`` in the package and in benchmarks/ whose first flag names a folder
    the command writes (:data:`FOLDER_OPTION`); the CLI's many ``--out`` get their sub-command's name."""
    found = set()
    for path in sorted([*(REPOSITORY / "custom" / "feddg").rglob("*.py"), *(REPOSITORY / "benchmarks").glob("*.py")]):
        rel = path.relative_to(REPOSITORY).as_posix()
        tree = ast.parse(path.read_text())
        command = None
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            first = node.args[0] if node.args else None
            if node.func.attr == "add_parser" and isinstance(first, ast.Constant):
                command = first.value
            if node.func.attr == "add_argument" and isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and FOLDER_OPTION.match(first.value):
                name = first.value
                if rel == "custom/feddg/cli.py" and name == "--out":
                    name = f"--out/{command}"
                found.add((rel, name))
    return found


def test_every_folder_option_is_guarded():
    """A new folder option anywhere fails here until it has a row in GUARDED (and so a refusal test below)."""
    declared = declared_folder_options()
    missing = declared - set(GUARDED)
    assert not missing, f"folder options without the guard's test: {sorted(missing)}"
    stale = {key for key in GUARDED if key[0] != "nvflare.recipe"} - declared
    assert not stale, f"rows for options that no longer exist: {sorted(stale)}"


@pytest.mark.parametrize("key", sorted(GUARDED), ids=lambda key: f"{key[0].rsplit('/', 1)[-1]}:{key[1]}")
def test_command_refuses_the_checkout(checkout, key):
    """Each command given the checkout it runs in (``.``) refuses in one line naming its option, and the checkout's
    .git and uncommitted file survive."""
    argv, option = GUARDED[key]
    argv = [a.replace("{F}", ".") for a in argv]
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "NVFLARE_SIMULATOR_WORKSPACE_ROOT": ""}
    env.pop("NVFLARE_SIMULATOR_WORKSPACE_ROOT")
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if option in line
             and ("refused" in line or "folder" in line or "work tree" in line)]
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    assert survived(checkout) and sorted(p.name for p in checkout.iterdir()) == [".git", "sentinel.txt"]


def test_simulate_refuses_an_empty_workspace_and_its_own_job_copy(checkout, tmp_path):
    """The two simulate cases that deleted folders: -w "" (emptied the current folder, then trained there) and
    -w OUT run on OUT_job/<job>, the copy an earlier --set wrote (deleted its own input)."""
    done = subprocess.run(_feddg("simulate", str(JOB), "-w", "", "--set", "train.rounds=1"), cwd=checkout,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "-w is empty" in done.stderr and survived(checkout)
    copy = claim(tmp_path / "OUT_job", "a test")  # as an earlier `feddg simulate ... -w OUT --set ...` made it
    job = copy / "fundus_fedavg"
    import shutil

    shutil.copytree(JOB, job)
    done = subprocess.run(_feddg("simulate", str(job), "-w", str(tmp_path / "OUT"), "--set", "train.rounds=2"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "holds this command's input" in done.stderr, done.stderr
    assert (job / "meta.json").is_file() and not (tmp_path / "OUT").exists()


def test_simulate_names_a_job_that_does_not_exist(tmp_path):
    done = subprocess.run(_feddg("simulate", "jobs/nonexistent", "-w", str(tmp_path / "ws")), cwd=REPOSITORY,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "jobs/nonexistent: not a job folder" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "ws").exists()


def test_a_dry_run_refuses_what_the_real_run_would(tmp_path, capsys):
    """--dry-run reports what a real run would refuse: an --out that is a file, one that is not ours."""
    from feddg.cli import main

    file = tmp_path / "results"
    file.write_text("not a folder")
    assert main(["benchmark", "--task", "fundus", "--out", str(file), "--dry-run"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and file.read_text() == "not a folder"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    assert main(["benchmark", "--task", "fundus", "--out", str(theirs), "--dry-run"]) == 2
    assert "was not made by feddg" in capsys.readouterr().err and sorted(theirs.iterdir()) == [theirs / "notes.txt"]


def test_a_simulator_workspace_may_hold_what_nvflare_keeps(tmp_path, monkeypatch):
    """NVFlare's simulator keeps a workspace's local/ and startup/ when it clears it: a user's own
    local/feddg_site.json there (documented in docs/jobs.md) does not make the workspace someone else's, while
    anything the clearing would delete does."""
    from feddg.folders import SIMULATOR_KEEPS

    monkeypatch.chdir(tmp_path)
    ws = tmp_path / "ws"
    (ws / "local").mkdir(parents=True)
    (ws / "local" / "feddg_site.json").write_text('{"num_threads": 1}')
    assert guard_folder(str(ws), "-w", keeps=SIMULATOR_KEEPS) == ws
    with pytest.raises(FolderRefused, match="was not made by feddg"):
        guard_folder(str(ws), "--out")  # a command that clears everything
    (ws / "notes.txt").write_text("mine")
    with pytest.raises(FolderRefused, match="was not made by feddg"):
        guard_folder(str(ws), "-w", keeps=SIMULATOR_KEEPS)
