"""The consortium's project.yml files provision with NVFlare 2.9, and the site policy installs into the kits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from feddg.experiment import TASK_DEFAULTS
from feddg.flare.site_policy import PACKAGE_PREFIX, authorization, install_site_policy, set_gpus
from feddg.provisioning import PROJECT_ADMIN, hospital_admins, project_file, stale_projects
from tests.conftest import REPOSITORY


def test_committed_projects_match_the_generator():
    assert stale_projects(REPOSITORY / "provisioning") == [], "run `feddg make-jobs` and commit provisioning/"


@pytest.mark.parametrize("task", sorted(TASK_DEFAULTS))
def test_nvflare_provision_writes_signed_kits_and_the_policy_installs(tmp_path, task):
    spec = yaml.safe_load((REPOSITORY / "provisioning" / project_file(task)).read_text())
    sites = TASK_DEFAULTS[task]["data"]["sites"]
    roles = {p["name"]: p.get("role") for p in spec["participants"] if p["type"] == "admin"}
    assert roles[PROJECT_ADMIN] == "project_admin"
    assert sum(r == "project_admin" for r in roles.values()) == 1
    for site in sites:
        assert {roles[n] for n in hospital_admins(site).values()} == {"lead", "member"}

    proc = subprocess.run([sys.executable, "-m", "nvflare.cli", "provision", "-p",
                           str(REPOSITORY / "provisioning" / project_file(task)), "-w", str(tmp_path / "ws")],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    prod = tmp_path / "ws" / spec["name"] / "prod_00"
    for site in sites:
        startup = prod / site / "startup"
        for name in ("client.crt", "client.key", "rootCA.pem", "fed_client.json", "start.sh"):
            assert (startup / name).exists(), f"{site}: {name}"
    server = next(p["name"] for p in spec["participants"] if p["type"] == "server")
    # Mutual TLS: every participant's certificate is issued by the project's root CA and names the participant.
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    root = x509.load_pem_x509_certificate((prod / server / "startup" / "rootCA.pem").read_bytes())
    for name, cert_file in [(server, "server.crt"), *((s, "client.crt") for s in sites)]:
        cert = x509.load_pem_x509_certificate((prod / name / "startup" / cert_file).read_bytes())
        assert cert.issuer == root.subject
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        cert.verify_directly_issued_by(root)

    install_site_policy(prod, num_gpus=0)
    for site in sites:
        local = prod / site / "local"
        resources = json.loads((local / "resources.json").read_text())
        assert PACKAGE_PREFIX in resources["class_allow_list"]
        assert not any("percentile_privacy" in c for c in resources["class_allow_list"])  # NVFlare's generic list
        manager = next(c for c in resources["components"] if c["path"].endswith("GPUResourceManager"))
        assert manager["args"]["num_of_gpus"] == 0
        privacy = json.loads((local / "privacy.json").read_text())
        assert privacy["default_scope"] == "feddg" and len(privacy["scopes"]) == 1
        assert privacy["scopes"][0]["task_result_filters"][0]["path"] == "feddg.flare.egress_filter.SiteEgressFilter"
        assert json.loads((local / "authorization.json").read_text()) == authorization()
    assert (prod / server / "local" / "authorization.json").exists()
    assert not (prod / server / "local" / "privacy.json").exists()


def test_authorization_only_leads_submit_and_nobody_brings_code():
    perms = authorization()["permissions"]
    assert perms["lead"]["submit_job"] == "any"
    assert perms["member"] == {"view": "any"}
    for role in ("project_admin", "org_admin"):
        assert perms[role]["submit_job"] == "none"
    for role in ("project_admin", "org_admin", "lead"):
        assert perms[role]["byoc"] == "none"


def test_gpus_are_named_in_the_resource_manager():
    resources = {"components": [{"path": "x.GPUResourceManager", "args": {"num_of_gpus": 0}}]}
    set_gpus(resources, 2, 80)
    assert resources["components"][0]["args"] == {"num_of_gpus": 2, "mem_per_gpu_in_GiB": 80}


def test_a_folder_without_kits_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no server or client startup kit"):
        install_site_policy(tmp_path)


def test_a_job_without_custom_code_cannot_add_a_filter_that_undoes_the_site_check():
    """Site filters run first on outgoing results; what a job can add after them is limited to the allow-list.
    That list holds no NVFlare filter, and the project's own filters only block (they return their input)."""
    import importlib

    from nvflare.apis.filter import Filter

    from feddg.flare.site_policy import class_allow_list

    for entry in class_allow_list():
        if entry.endswith("."):
            continue
        module, name = entry.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        assert not (isinstance(cls, type) and issubclass(cls, Filter)), entry
