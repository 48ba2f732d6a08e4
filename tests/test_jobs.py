"""The job template, the committed job folders and the site policy derived from them."""

import json
from pathlib import Path

import pytest

from feddg.experiment import load_experiment
from feddg.flare.site_policy import INJECTED_BY_NVFLARE, class_allow_list, component_paths, install_resources
from feddg.jobs import JOBS
from feddg.recipes.export import job_files, stale_jobs
from tests.conftest import REPOSITORY


def test_committed_jobs_equal_the_template():
    assert stale_jobs(REPOSITORY / "jobs") == [], \
        "run `feddg make-jobs` after changing feddg/jobs.py or feddg/experiment.py"


@pytest.mark.parametrize("name", JOBS)
def test_job_folders_are_classic_nvflare_jobs_without_custom_code(name):
    job = REPOSITORY / "jobs" / name
    meta = json.loads((job / "meta.json").read_text())
    cfg = load_experiment(job / "app" / "config" / "feddg.yaml")
    assert meta["deploy_map"] == {"app": ["server", *cfg.data.sites]}
    assert not (job / "app" / "custom").exists()
    assert cfg.data.unseen_site in cfg.data.sites


def test_allow_list_is_the_package_plus_exactly_the_nvflare_classes_jobs_use():
    allow = class_allow_list()
    assert allow[0] == "feddg."
    used = set()
    for name in JOBS:
        for rel, content in job_files(name).items():
            if rel.endswith(".json") and "config_fed_" in rel:
                used |= component_paths(json.loads(content))
    assert set(allow[1:]) == {p for p in used if p.startswith("nvflare.")} | set(INJECTED_BY_NVFLARE)
    assert all(p.startswith("feddg.") for p in used if not p.startswith("nvflare."))


def test_install_resources_keeps_existing_settings(tmp_path):
    (tmp_path / "resources.json").write_text(json.dumps({"format_version": 2, "class_allow_list": ["x.y.Z"],
                                                         "other": 1}))
    path = install_resources(tmp_path)
    data = json.loads(path.read_text())
    assert data["other"] == 1 and data["class_allow_list"][0] == "x.y.Z" and "feddg." in data["class_allow_list"]
    install_resources(tmp_path)  # idempotent
    assert json.loads(path.read_text())["class_allow_list"].count("feddg.") == 1


def test_install_resources_starts_from_a_kits_default_file(tmp_path):
    (tmp_path / "resources.json.default").write_text(json.dumps(
        {"format_version": 2, "components": [{"id": "resource_manager"}], "class_allow_list": ["nvflare.x.Y"]}))
    data = json.loads(install_resources(tmp_path).read_text())
    assert data["components"] == [{"id": "resource_manager"}]
    assert data["class_allow_list"] == class_allow_list()


def _files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Relative path -> (modification time, content) of every file under ``folder``."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("args, message", [
    (["--set", "train.rounds=3", "--out", ""], "--out is empty"),
    (["--paper"], "--set and --paper write jobs that differ from the template: give --out DIR"),
    (["--set", "train.rounds=3", "--out", str(REPOSITORY / "jobs" / "extra")], "is in the repository's committed"),
    (["--set", "train.rounds=3", "--out", "."], "--out '.' ("),
])
def test_make_jobs_never_writes_over_the_committed_jobs_nor_into_a_full_current_folder(args, message, tmp_path,
                                                                                        monkeypatch, capsys):
    from feddg.cli import main

    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    before = _files(REPOSITORY / "jobs")
    assert main(["make-jobs", *args]) == 2
    assert message in capsys.readouterr().err
    assert _files(REPOSITORY / "jobs") == before and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
