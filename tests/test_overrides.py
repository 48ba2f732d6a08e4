"""--set overrides: parsed as YAML values into nested settings, validated by the schema as a whole, applied to a copy
of a job whose meta.json follows the sites; never written over the committed jobs."""

from __future__ import annotations

import json

import pytest

from feddg.cli import main
from feddg.config import ConfigError
from feddg.experiment import TASK_DEFAULTS, load_experiment, parse_overrides, with_overrides
from feddg.jobs import override_job
from tests.conftest import REPOSITORY, TINY_HELD_OUT_CASES, tiny_experiment, tiny_overrides, tiny_sets

JOBS = REPOSITORY / "jobs"


def test_values_are_read_as_yaml_into_nested_settings():
    assert parse_overrides(["train.rounds=20", "train.lr=1e-3", "data.sites=[BMC, HK, UCL]",
                            "data.root=/data/prostate", "train.augment=false"]) == {
        "train": {"rounds": 20, "lr": 0.001, "augment": False},
        "data": {"root": "/data/prostate", "sites": ["BMC", "HK", "UCL"]}}


@pytest.mark.parametrize("task", ["prostate", "fundus"])
def test_the_tests_tiny_options_read_back_as_the_tiny_experiment(task):
    """The command-line tests' ``--set`` options (tests/conftest.py) are the component tests' tiny setting."""
    train = {"rounds": 2, "local_epochs": 1}
    options = tiny_sets(task, TINY_HELD_OUT_CASES, **train)
    assert options[::2] == ["--set"] * (len(options) // 2)
    overrides = parse_overrides(options[1::2])
    assert overrides == tiny_overrides(task, TINY_HELD_OUT_CASES, **train)
    experiment, _ = with_overrides(TASK_DEFAULTS[task], overrides, f"{task}'s defaults")
    tiny = tiny_experiment(task, **train)
    tiny["data"]["synthetic"]["held_out_cases"] = TINY_HELD_OUT_CASES
    assert all(experiment[s] == tiny[s] for s in ("data", "model", "eval"))


@pytest.mark.parametrize("bad, reason", [("train.rounds", "expected section.key=value"),
                                         ("=3", "expected section.key=value"),
                                         ("train..rounds=3", "expected section.key=value"),
                                         ("train.rounds=[1", "cannot read the value")])
def test_malformed_assignments_are_refused(bad, reason):
    with pytest.raises(ConfigError, match=reason):
        parse_overrides([bad])


@pytest.mark.parametrize("assignments, reason", [
    (["data.root=null", "data.root=/data/prostate"], r"--set data.root given twice \('data.root=null' and"),
    (["train.rounds=1", " train.rounds =2"], "--set train.rounds given twice"),
])
def test_a_key_given_twice_is_refused(assignments, reason):
    """The last value used to win silently: which one was meant is the user's to say."""
    with pytest.raises(ConfigError, match=reason):
        parse_overrides(assignments)


@pytest.mark.parametrize("assignment, reason", [
    ("train.lr.x=1", r"--set train.lr.x: train.lr is a setting \(float 0.001\), not a section"),
    ("data.sites.HK=1", r"--set data.sites.HK: data.sites is a setting \(list .*\), not a section"),
    ("data.unseen_site.name=BMC", r"--set data.unseen_site.name: data.unseen_site is a setting \(str 'RUNMC'\)"),
])
def test_a_key_under_a_value_is_refused_by_name(tmp_path, assignment, reason):
    """Was a TypeError traceback (train.lr.x) and "dictionary update sequence element #0 has length 7"
    (data.sites.HK), on every command that takes --set."""
    with pytest.raises(ConfigError, match=reason):
        override_job(JOBS / "prostate_ga", parse_overrides([assignment]), tmp_path / "job")
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("command", [
    ["make-jobs", "--out", "{tmp}", "fundus_fedavg"],
    ["simulate", str(JOBS / "fundus_fedavg"), "-w", "{tmp}/ws"],
    ["benchmark", "--task", "fundus", "--methods", "fedavg", "--seeds", "0", "--out", "{tmp}/sweep", "--dry-run"],
])
def test_another_tasks_data_task_is_refused_before_anything_runs(tmp_path, capsys, command):
    """--set data.task=prostate on a fundus job was accepted by make-jobs and job.py --export, and the run failed
    40 s in; now every command refuses it at once, naming the key, and writes nothing."""
    argv = [a.replace("{tmp}", str(tmp_path / "out")) for a in command] + ["--set", "data.task=prostate"]
    assert main(argv) == 2
    assert "--set data.task" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_job_py_export_refuses_another_tasks_data_task(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(JOBS.parent / "job.py"), "fundus_fedavg", "--set", "data.task=prostate",
                           "--export", "--export-dir", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--set data.task=prostate: fundus_fedavg is a fundus job" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_job_copy_with_overrides_is_consistent(tmp_path):
    out = override_job(JOBS / "prostate_ga", parse_overrides(["data.sites=[BMC, HK, RUNMC]", "train.rounds=2"]),
                       tmp_path / "job")
    cfg = load_experiment(out / "app" / "config" / "feddg.yaml")
    assert cfg.data.sites == ["BMC", "HK", "RUNMC"] and cfg.train.rounds == 2 and cfg.data.unseen_site == "RUNMC"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["deploy_map"] == {"app": ["server", "BMC", "HK", "RUNMC"]} and meta["min_clients"] == 2
    assert (out / "app" / "config" / "config_fed_server.json").read_text() == \
        (JOBS / "prostate_ga" / "app" / "config" / "config_fed_server.json").read_text()


@pytest.mark.parametrize("assignment, reason", [("train.roundz=3", "train.roundz: unknown key"),
                                                ("train.rounds=twenty", "train.rounds: input should be a valid"),
                                                ("data.unseen_site=Nowhere", "data.unseen_site: 'Nowhere' is not")])
def test_a_wrong_override_is_refused_by_name(tmp_path, assignment, reason):
    with pytest.raises(ConfigError, match=reason):
        override_job(JOBS / "prostate_ga", parse_overrides([assignment]), tmp_path / "job")
    assert not (tmp_path / "job").exists()


def test_make_jobs_writes_overrides_only_elsewhere(tmp_path, capsys):
    assert main(["make-jobs", "--set", "train.rounds=3"]) == 2
    assert main(["make-jobs", "--out", str(JOBS), "--set", "train.rounds=3"]) == 2
    assert "is in the repository's committed" in capsys.readouterr().err
    assert main(["make-jobs", "--out", str(tmp_path), "--set", "data.unseen_site=BMC", "prostate_fedprox"]) == 0
    cfg = load_experiment(tmp_path / "prostate_fedprox" / "app" / "config" / "feddg.yaml")
    assert cfg.data.unseen_site == "BMC" and cfg.train.fedprox_mu == 0.01
    assert not (tmp_path / "provisioning").exists()
