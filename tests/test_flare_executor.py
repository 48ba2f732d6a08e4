"""``--executor flare`` refuses a sweep before any submission, in one line: a kit that is not a lead's admin kit
(a site's or the server's kit, a member's or the project admin's), a server that does not answer (a closed loopback
port), a site the deployment does not have. The kits are real ones from ``nvflare poc prepare`` with the
consortium's project and site policy; the server is NVFlare's own client code failing to reach a closed port.
Also: the job the deployment receives carries no data path, a site reads its own data root, and a job the
deployment refuses or that runs past its time is that run's failure or timeout (a stand-in for the admin session,
answering with NVFlare's own objects and exceptions; the real deployment is tests/e2e/test_sweep_flare.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
import yaml
from nvflare.fuel.flare_api.api_spec import ClientInfo, ServerInfo, SystemInfo

from feddg.benchmark.executors import flare
from feddg.benchmark.executors.base import Cell, ExecutorError
from feddg.benchmark.protocol import Run
from feddg.config import config_from_dict
from feddg.flare.site_config import AT_EACH_SITE, SiteConfig, SiteConfigError, site_data
from feddg.recipes.export import write_job
from feddg.provisioning import PROJECT_ADMIN, hospital_admins
from tests.conftest import LOOPBACK_SITES as SITES
from tests.conftest import lead_kit_to_closed_port, tiny_experiment






def _cell(tmp_path: Path, root: str | None = None, sites: list[str] = SITES) -> Cell:
    exp = tiny_experiment("prostate", root=root)
    exp["data"].update(sites=sites, unseen_site="RUNMC")
    folder = tmp_path / "runs" / "prostate_fedavg_RUNMC_seed0"
    job = write_job(folder, "prostate_fedavg", exp)
    return Cell(Run("prostate", "fedavg", "RUNMC", 0), job, folder, 600, 1)


def _refusal(kit: Path, cells: list[Cell]) -> str:
    with pytest.raises(ExecutorError) as e:
        flare.FlareExecutor(kit, connect_timeout=2).check(cells)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("who,expected", [
    ("BIDMC", "a site's (client) startup kit, not an admin kit"),
    ("localhost", "the server's startup kit, not an admin kit"),
])
def test_a_kit_of_the_wrong_kind_is_refused(loopback_kits, tmp_path, who, expected):
    message = _refusal(loopback_kits.kit(who), [_cell(tmp_path)])
    assert expected in message and str(loopback_kits.kit(who)) in message


def test_a_folder_that_is_no_kit_is_refused(tmp_path):
    assert "not a startup kit, not an admin kit" in _refusal(tmp_path, [_cell(tmp_path)])
    assert "no such folder" in _refusal(tmp_path / "absent", [_cell(tmp_path)])


@pytest.mark.parametrize("who,role", [
    (hospital_admins("BIDMC")["member"], "member"),
    (PROJECT_ADMIN, "project_admin"),
])
def test_an_admin_kit_of_a_role_that_may_not_submit_is_refused(loopback_kits, tmp_path, who, role):
    message = _refusal(loopback_kits.kit(who), [_cell(tmp_path)])
    assert f"has the role {role!r}, which may not submit jobs" in message and "(lead)" in message


def test_the_role_is_read_from_the_kit_certificate(loopback_kits):
    kit = flare.read_admin_kit(loopback_kits.kit(loopback_kits.lead))
    assert (kit.user, kit.org, kit.role) == (loopback_kits.lead, "BIDMC", "lead")
    assert flare.submitting_roles() == ["lead"]


def test_a_server_that_does_not_answer_is_refused_within_the_connect_timeout(loopback_kits, tmp_path):
    kit, port = lead_kit_to_closed_port(loopback_kits, tmp_path)
    started = time.monotonic()
    message = _refusal(kit, [_cell(tmp_path)])
    assert f"the deployment's server 127.0.0.1:{port} did not answer within 2 s" in message
    assert time.monotonic() - started < 30


def test_a_site_the_deployment_does_not_have_is_refused(loopback_kits, tmp_path, monkeypatch):
    """The deployment as NVFlare's admin API describes it (its own SystemInfo objects): BIDMC and BMC connected, the
    sweep's jobs need RUNMC and HK as well."""
    class Deployment:
        def get_system_info(self) -> SystemInfo:
            return SystemInfo(ServerInfo("started", 0.0), [ClientInfo("BIDMC", 0.0), ClientInfo("BMC", 0.0)], [])

        def close(self) -> None:
            pass

    def connect(self, timeout):
        self._session = Deployment()

    monkeypatch.setattr(flare.FlareExecutor, "_connect", connect)
    lead = loopback_kits.kit(loopback_kits.lead)
    message = _refusal(lead, [_cell(tmp_path, sites=["BIDMC", "BMC", "HK", "RUNMC"])])
    assert "has no connected site HK, RUNMC (its connected sites: BIDMC, BMC)" in message


@pytest.mark.parametrize("options,expected", [
    ([], "--executor flare needs --kit ADMIN_KIT"),
    (["--kit", ".", "--max-jobs", "0"], "--max-jobs 0"),
    (["--kit", ".", "--site-gpus", "-1"], "must not be negative"),
])
def test_bad_options_are_refused_by_name(options, expected):
    parser = argparse.ArgumentParser()
    flare.add_arguments(parser.add_argument_group())
    with pytest.raises(ExecutorError, match=expected):
        flare.from_args(parser.parse_args(options))


def test_the_submitted_job_carries_no_data_path_and_asks_every_site_for_its_resources(tmp_path):
    cell = _cell(tmp_path, root="/data/at/the/leads/hospital")
    job = flare.submission(cell, tmp_path / "submit", {"num_of_gpus": 1, "mem_per_gpu_in_GiB": 8.0})
    text = (job / "app" / "config" / "feddg.yaml").read_text()
    assert "/data/at/the/leads/hospital" not in text
    assert yaml.safe_load(text)["data"]["root"] == AT_EACH_SITE
    meta = json.loads((job / "meta.json").read_text())
    assert meta["name"] == cell.run_id == job.name
    assert meta["resource_spec"] == {site: {"num_of_gpus": 1, "mem_per_gpu_in_GiB": 8.0} for site in SITES}
    assert sorted(meta["deploy_map"]["app"]) == sorted(["server", *SITES])  # the held-out site is deployed too
    # the synthetic data are generated at every site: nothing to replace
    synthetic = flare.submission(_cell(tmp_path / "s"), tmp_path / "submit_s", {"num_of_gpus": 0})
    assert yaml.safe_load((synthetic / "app" / "config" / "feddg.yaml").read_text())["data"]["root"] is None


def test_a_site_reads_its_own_data_root():
    data = config_from_dict(tiny_experiment("prostate", root=AT_EACH_SITE)).data
    assert site_data(data, SiteConfig(data_root="/site/data"), "local/feddg_site.json").root == "/site/data"
    with pytest.raises(SiteConfigError, match="local/feddg_site.json: the job reads each hospital's own data, but "
                                              "this site sets no data_root"):
        site_data(data, SiteConfig(), "local/feddg_site.json")
    # a job with a path keeps it at a site that sets none; synthetic data stay synthetic
    shared = config_from_dict(tiny_experiment("prostate", root="/shared")).data
    assert site_data(shared, SiteConfig(), "x").root == "/shared"
    synthetic = config_from_dict(tiny_experiment("prostate")).data
    assert site_data(synthetic, SiteConfig(data_root="/site/data"), "x").root is None


def test_the_sweep_checks_no_data_on_the_leads_host_for_a_deployment(tmp_path):
    """The data stay at the sites: a sweep into a deployment does not look for them here (a local one does)."""
    from feddg.benchmark.executors.local import LocalExecutor
    from feddg.benchmark.sweep import Protocol, sweep
    from feddg.config import ConfigError

    protocol = Protocol("prostate", {"data": {"root": str(tmp_path / "not_here"), "layout": "saml_nifti"},
                                     "train": {"rounds": 1}})
    assert sweep(tmp_path / "out", protocol, ["fedavg"], ["RUNMC"], [0], dry_run=True, report=lambda line: None,
                 executor=flare.FlareExecutor(tmp_path)) == []
    with pytest.raises(ConfigError, match="data.root .*not_here"):
        sweep(tmp_path / "out", protocol, ["fedavg"], ["RUNMC"], [0], dry_run=True, report=lambda line: None,
              executor=LocalExecutor())


def test_a_job_the_deployment_refuses_is_that_runs_failure_and_the_sweep_goes_on(loopback_kits, tmp_path, monkeypatch):
    """The server's answer is NVFlare's own exception (an invalid job definition); the next cell is still run."""
    from nvflare.fuel.flare_api.api_spec import InvalidJobDefinition

    class Deployment:
        def get_system_info(self) -> SystemInfo:
            return SystemInfo(ServerInfo("started", 1.0), [ClientInfo(site, 0.0) for site in SITES], [])

        def submit_job(self, path: str) -> str:
            raise InvalidJobDefinition("invalid job definition: no app for RUNMC")

        def close(self) -> None:
            pass

    def connect(self, timeout):
        self._session = Deployment()

    monkeypatch.setattr(flare.FlareExecutor, "_connect", connect)
    cells = [_cell(tmp_path / "a"), _cell(tmp_path / "b")]
    done = []
    lead = loopback_kits.kit(loopback_kits.lead)
    flare.FlareExecutor(lead).run_cells(cells, lambda cell, outcome: done.append(outcome), report=lambda line: None)
    assert [o.status for o in done] == ["failed", "failed"]
    assert done[0].reason == ("the deployment refused the job: InvalidJobDefinition: invalid job definition: no app "
                              "for RUNMC")
    assert done[0].server_dir is None and done[0].where["job_id"] is None
    assert "the deployment refused the job" in cells[0].log.read_text()


def test_a_job_past_its_time_is_aborted_and_its_log_kept(loopback_kits, tmp_path, monkeypatch):
    """A deployment whose job never ends by itself: the executor aborts it at the cell's time limit (counted from
    when it runs), waits for the abort to land, downloads what the server has and reports a timeout."""
    class Deployment:
        aborted = False

        def get_system_info(self) -> SystemInfo:
            return SystemInfo(ServerInfo("started", 1.0), [ClientInfo(site, 0.0) for site in SITES], [])

        def submit_job(self, path: str) -> str:
            return "0f6b1d3e-0000-4000-8000-000000000001"

        def get_job_meta(self, job_id: str) -> dict:
            return {"status": "FINISHED:ABORTED" if self.aborted else "RUNNING"}

        def abort_job(self, job_id: str) -> str:
            self.aborted = True
            return "aborted"

        def download_job_result(self, job_id: str, destination: str) -> str:
            log = Path(destination) / job_id / "workspace" / "log.txt"
            log.parent.mkdir(parents=True)
            log.write_text("2026-01-01 00:00:00,000 - ServerRunner - INFO - the server's own line\n")
            return str(log.parent.parent)

        def close(self) -> None:
            pass

    def connect(self, timeout):
        self._session = Deployment()

    monkeypatch.setattr(flare.FlareExecutor, "_connect", connect)
    monkeypatch.setattr(flare, "POLL_S", 0.01)
    base = _cell(tmp_path)
    cell = Cell(base.run, base.job, base.folder, 0.2, 1)
    done = []
    lead = loopback_kits.kit(loopback_kits.lead)
    flare.FlareExecutor(lead).run_cells([cell], lambda c, outcome: done.append(outcome), report=lambda line: None)
    [outcome] = done
    assert outcome.status == "timeout" and outcome.server_dir is None
    assert outcome.reason == "job 0f6b1d3e-0000-4000-8000-000000000001 aborted after 0 s running"
    assert outcome.where["job_status"] == "RUNNING" and outcome.where["sites"] == SITES
    log = cell.log.read_text()
    assert "the server's own line" in log and log.rstrip().endswith(outcome.reason)
