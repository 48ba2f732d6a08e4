"""The NVFlare 2.9 Recipes (:mod:`feddg.recipes`): their exports are the committed job folders byte for byte, every
exported argument is the registry's, a method registered from outside the package gets a recipe, bad input is
refused in one line before any FedJob is built, and ``--env prod`` checks the kit against real kits of a loopback
POC before building anything. The environments' own runs are in tests/e2e/test_recipes_env.py (slow)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvflare.recipe.sim_env import SIMULATOR_WORKSPACE_ROOT_ENV_VAR, SimEnv

from feddg.config import ConfigError
from feddg.flare.registry import register_entry_points, unregister
from feddg.flare.site_policy import class_allow_list, component_entries
from feddg.jobs import JOBS, client_config, server_config
from feddg.recipes import FedDGRecipe, job_names
from feddg.recipes import recipe as recipe_module
from feddg.recipes.export import folder_files, stale_jobs, write_job
from feddg.recipes.main import main
from feddg.recipes.sim import FedDGSimEnv
from tests.conftest import LOOPBACK_SITES as SITES, REPOSITORY
from tests.conftest import lead_kit_to_closed_port
from tests.toy_method.plugin import write_plugin


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Path:
    """Every committed job exported once from its recipe."""
    out = tmp_path_factory.mktemp("exports")
    for name in JOBS:
        write_job(out, name)
    return out


@pytest.mark.parametrize("name", JOBS)
def test_every_export_equals_the_committed_job_byte_for_byte(exports, name):
    exported, committed = folder_files(exports / name), folder_files(REPOSITORY / "jobs" / name)
    assert sorted(exported) == ["app/config/config_fed_client.json", "app/config/config_fed_server.json",
                                "app/config/feddg.yaml", "meta.json"]  # one app, no app/custom
    assert exported == committed, "run `feddg make-jobs` after changing feddg/jobs.py or the registry"


def _by_path(config: dict) -> dict[str, list[dict]]:
    """Class path -> the args of every component of that class in an NVFlare config."""
    found: dict[str, list[dict]] = {}
    for entry in component_entries(config):
        found.setdefault(entry["path"], []).append(entry.get("args", {}))
    return found


@pytest.mark.parametrize("name", JOBS)
def test_every_exported_argument_equals_the_registrys(exports, name):
    """NVFlare's export reads each argument back from the object (``self.<arg>``), drops those equal to their
    default and reads a base class's only through a literal ``*args, **kwargs``: none of that may lose or add one
    (ELCFS + GA's executor would lose ``site_hooks`` and with it GA's gaps)."""
    method = name.split("_", 1)[1]
    config = exports / name / "app" / "config"
    for registry, file in ((server_config(method), "config_fed_server.json"),
                           (client_config(method), "config_fed_client.json")):
        exported = json.loads((config / file).read_text())
        assert _by_path(exported) == _by_path(registry), file
    client = json.loads((config / "config_fed_client.json").read_text())
    assert client["executors"][0]["tasks"] == client_config(method)["executors"][0]["tasks"]
    meta = json.loads((exports / name / "meta.json").read_text())
    assert meta["deploy_map"] == {"app": ["server", *FedDGRecipe(*name.split("_", 1)).sites]}


def test_elcfs_with_ga_exports_the_base_executors_arguments(exports):
    args = json.loads((exports / "prostate_elcfs_ga" / "app" / "config" / "config_fed_client.json").read_text()
                      )["executors"][0]["executor"]["args"]
    assert args == {"config_file": "feddg.yaml", "tb_writer_id": "tb_writer", "site_hooks": ["generalization_gap"]}


def test_an_extra_custom_folder_or_a_changed_byte_is_drift(tmp_path):
    shutil.copytree(REPOSITORY / "jobs" / "prostate_ga", tmp_path / "prostate_ga")
    assert stale_jobs(tmp_path, ["prostate_ga"]) == []
    custom = tmp_path / "prostate_ga" / "app" / "custom" / "feddg" / "x.py"
    custom.parent.mkdir(parents=True)
    custom.write_text("")
    meta = tmp_path / "prostate_ga" / "meta.json"
    meta.write_bytes(meta.read_bytes() + b"\n")
    assert stale_jobs(tmp_path, ["prostate_ga"]) == [str(custom), str(meta)]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The toy method (tests/toy_method) registered as a plug-in, as an installed package's entry point does."""
    monkeypatch.syspath_prepend(str(write_plugin(tmp_path / "plugin")))
    assert register_entry_points() == ["median"]
    yield
    unregister("median")


def test_a_method_registered_from_outside_the_package_gets_a_recipe(plugin, tmp_path):
    assert "prostate_median" in job_names()
    recipe = FedDGRecipe("prostate", "median", {"median": {"trim": 1}})
    recipe.export(str(tmp_path))
    job = tmp_path / "prostate_median"
    assert sorted(folder_files(job)) == ["app/config/config_fed_client.json", "app/config/config_fed_server.json",
                                         "app/config/feddg.yaml", "meta.json"]  # its package is not copied in
    server = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    client = json.loads((job / "app" / "config" / "config_fed_client.json").read_text())
    assert _by_path(server) == _by_path(server_config("median"))
    assert _by_path(client) == _by_path(client_config("median"))
    assert "tests.toy_method.aggregator.MedianAggregator" in _by_path(server)
    assert "median:\n  trim: 1\n" in (job / "app" / "config" / "feddg.yaml").read_text()


@pytest.fixture
def no_fedjob(monkeypatch):
    """FedJob replaced by one that records that it was built (and refuses to be)."""
    built: list[str] = []

    def fedjob(*args, **kwargs):
        built.append(kwargs.get("name", "?"))
        raise AssertionError("a FedJob was built")

    monkeypatch.setattr(recipe_module, "FedJob", fedjob)
    return built


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_bad_set_key_fails_before_any_fedjob_is_built(no_fedjob, capsys):
    with pytest.raises(ConfigError, match="train.nope: unknown key; known keys are"):
        FedDGRecipe("prostate", "ga", {"train": {"nope": 1}})
    assert main(["prostate_ga", "--set", "train.nope=1"]) == 2
    err = _one_line_error(capsys)
    assert "train.nope: unknown key" in err and "'rounds'" in err
    assert main(["prostate_ga", "--set", "data.unseen_site=Nowhere"]) == 2
    assert "Nowhere" in _one_line_error(capsys)
    assert no_fedjob == []


@pytest.mark.parametrize("args, expected", [
    (["prostate_nope"], "unknown job 'prostate_nope'; the jobs are prostate_fedavg, fundus_fedavg"),
    (["liver_ga"], "unknown job 'liver_ga'"),
    (["prostate_ga", "--env", "prod"], "--env prod needs --kit ADMIN_KIT"),
    (["prostate_ga", "--env", "poc", "-w", "/tmp/x"], "-w: not an option of --env poc (-w is for --env sim)"),
    (["prostate_ga", "--kit", "/tmp/x"], "--kit: not an option of --env sim"),
])
def test_bad_input_is_one_line_and_builds_nothing(no_fedjob, capsys, args, expected):
    assert main(args) == 2
    assert expected in _one_line_error(capsys)
    assert no_fedjob == []


def test_an_unknown_method_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown method 'nope'; the methods are fedavg, uniform"):
        FedDGRecipe("prostate", "nope")


def test_export_writes_the_job_folder_under_the_export_dir(tmp_path):
    """``--export`` and ``--export-dir`` are NVFlare's, read when ``nvflare.recipe`` is imported: a real process."""
    proc = subprocess.run([sys.executable, str(REPOSITORY / "job.py"), "prostate_ga", "--set", "train.rounds=2",
                           "--export", "--export-dir", str(tmp_path / "D")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = tmp_path / "D" / "prostate_ga"
    assert sorted(folder_files(job)) == sorted(folder_files(REPOSITORY / "jobs" / "prostate_ga"))
    assert "  rounds: 2\n" in (job / "app" / "config" / "feddg.yaml").read_text()
    assert folder_files(job)["app/config/config_fed_client.json"] == \
        folder_files(REPOSITORY / "jobs" / "prostate_ga")["app/config/config_fed_client.json"]
    assert "UserWarning" not in proc.stderr


# ------------------------------------------------------------------------------------------------ --env sim, unit


def test_the_simulator_workspace_gets_the_projects_allow_list_over_nvflares_generic_one(tmp_path, monkeypatch):
    """A plain SimEnv run leaves NVFlare's generic allow-list in ``local/resources.json.default``; the project's
    replaces it, and NVFLARE_SIMULATOR_WORKSPACE_ROOT moves the run as it moves SimEnv's."""
    monkeypatch.setenv(SIMULATOR_WORKSPACE_ROOT_ENV_VAR, str(tmp_path / "from_env"))
    with pytest.warns(RuntimeWarning, match=SIMULATOR_WORKSPACE_ROOT_ENV_VAR):
        env = FedDGSimEnv(clients=SITES, workspace_root=tmp_path / "given")
    run = tmp_path / "from_env" / "prostate_ga"
    SimEnv._ensure_default_component_policy(str(run))  # NVFlare's own generic policy, as a plain SimEnv writes it
    generic = json.loads((run / "local" / "resources.json.default").read_text())["class_allow_list"]
    assert generic != class_allow_list()
    resources = env.install_policy("prostate_ga")
    assert resources == run / "local" / "resources.json"
    assert json.loads(resources.read_text())["class_allow_list"] == class_allow_list()
    SimEnv._ensure_default_component_policy(str(run))  # what SimEnv.deploy then does: keeps ours
    assert json.loads(resources.read_text())["class_allow_list"] == class_allow_list()
    assert not (tmp_path / "given").exists()


def test_the_simulator_tells_every_site_process_how_many_share_the_host(monkeypatch):
    monkeypatch.delenv("FEDDG_CONCURRENT_RUNS", raising=False)
    assert FedDGSimEnv(clients=SITES, workspace_root="/tmp/x").site_processes() == 3
    assert FedDGSimEnv(clients=SITES, workspace_root="/tmp/x", num_threads=1).site_processes() == 1
    assert FedDGSimEnv(clients=SITES, workspace_root="/tmp/x", gpu_config="[0,1],[2]").site_processes() == 2
    monkeypatch.setenv("FEDDG_CONCURRENT_RUNS", "2")
    assert FedDGSimEnv(clients=SITES, workspace_root="/tmp/x").site_processes() == 6


def test_the_simulated_sites_must_be_the_jobs():
    env = FedDGSimEnv(clients=["BMC", "HK"], workspace_root="/tmp/x")
    with pytest.raises(ValueError, match="are not the sites of prostate_ga"):
        FedDGRecipe("prostate", "ga").process_env(env)


def test_an_mla_job_shares_the_local_model_at_its_simulated_sites(tmp_path):
    env = FedDGSimEnv(clients=["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"], workspace_root=tmp_path)
    FedDGRecipe("prostate", "mlabin").process_env(env)
    env.install_policy("prostate_mlabin")
    assert json.loads((tmp_path / "prostate_mlabin" / "local" / "feddg_site.json").read_text()) == env.site_settings
    assert env.site_settings  # MLA asks the sites to share their last local model


# ------------------------------------------------------------------------------------------ --env prod, the checks


def _prod_refusal(kit: Path, capsys) -> str:
    started = time.monotonic()
    assert main(["prostate_ga", "--env", "prod", "--kit", str(kit)]) == 2
    assert time.monotonic() - started < 10
    return _one_line_error(capsys)


def test_prod_refuses_a_lead_kit_whose_server_does_not_answer(loopback_kits, tmp_path, no_fedjob, capsys):
    kit, port = lead_kit_to_closed_port(loopback_kits, tmp_path)
    err = _prod_refusal(kit, capsys)
    assert f"the deployment's server 127.0.0.1:{port} refused the connection" in err and str(kit) in err
    assert no_fedjob == []


@pytest.mark.parametrize("who, expected", [
    ("BIDMC", "a site's (client) startup kit, not an admin kit"),
    ("localhost", "the server's startup kit, not an admin kit"),
    ("member@bidmc.hospital.example.org", "has the role 'member', which may not submit jobs"),
])
def test_prod_refuses_a_kit_that_may_not_submit(loopback_kits, no_fedjob, capsys, who, expected):
    err = _prod_refusal(loopback_kits.kit(who), capsys)
    assert expected in err and str(loopback_kits.kit(who)) in err
    assert no_fedjob == []


def test_prod_refuses_a_missing_kit(tmp_path, no_fedjob, capsys):
    assert "no such folder" in _prod_refusal(tmp_path / "absent", capsys)
    assert no_fedjob == []


def test_prod_logs_in_as_the_kits_own_admin(loopback_kits, monkeypatch):
    from feddg.recipes import prod

    monkeypatch.setattr(prod, "check_server", lambda kit, timeout=0: None)  # the server is checked above
    env = prod.prod_env(loopback_kits.kit(loopback_kits.lead))
    lead = loopback_kits.kit(loopback_kits.lead)
    assert env.username == loopback_kits.lead and Path(env.startup_kit_location) == lead.resolve()


def test_the_command_module_runs_with_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "feddg.recipes", "prostate_nope"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("python -m feddg.recipes: error: unknown job 'prostate_nope'"), proc.stderr
