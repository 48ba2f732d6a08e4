"""`feddg install-policy` on a provisioned deployment: everything is read and checked before anything is written."""

from __future__ import annotations

import json

import pytest

from feddg.cli import main
from feddg.flare.site_limits import egress_limits
from feddg.flare.site_policy import PACKAGE_PREFIX, client_privacy, install_site_policy
from tests.conftest import REPOSITORY

DEFAULT_RESOURCES = {"format_version": 2, "components": [
    {"id": "resource_manager", "path": "nvflare.app_common.resource_managers.gpu_resource_manager.GPUResourceManager",
     "args": {"num_of_gpus": 0, "mem_per_gpu_in_GiB": 0}}]}


def _deployment(tmp_path, broken_file: str | None = None, content: bytes = b""):
    """prod_00 with a server kit and two client kits as `nvflare provision` writes them (startup/ and
    local/resources.json.default); ``broken_file`` of site-2's local/ gets ``content``."""
    prod = tmp_path / "prod_00"
    for name, kind in (("server1", "server"), ("site-1", "client"), ("site-2", "client")):
        (prod / name / "startup").mkdir(parents=True)
        (prod / name / "startup" / f"fed_{kind}.json").write_text("{}")
        (prod / name / "local").mkdir()
        (prod / name / "local" / "resources.json.default").write_text(json.dumps(DEFAULT_RESOURCES))
    if broken_file is not None:
        (prod / "site-2" / "local" / broken_file).write_bytes(content)
    return prod


def _snapshot(prod):
    return {str(p.relative_to(prod)): p.read_bytes() for p in sorted(prod.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("broken_file, content, problem", [
    ("resources.json", b'{"format_version": 2,', "cannot read it as JSON"),
    ("resources.json", b'["feddg."]', "expected a JSON object, got an array"),
    ("resources.json", b'{"class_allow_list": "feddg."}', "class_allow_list must be a list"),
    ("resources.json.default", "{}".encode("utf-16"), "cannot read it as JSON"),
    ("resources.json.default", b"null", "expected a JSON object, got null"),
    ("resources.json.default", b'{"components": {"id": "x"}}', "components must be a list of JSON objects"),
], ids=["truncated", "array", "allow-list-not-a-list", "utf16", "null", "components-not-a-list"])
def test_a_broken_kit_leaves_every_kit_untouched_and_is_named(tmp_path, capsys, broken_file, content, problem):
    prod = _deployment(tmp_path, broken_file, content)
    before = _snapshot(prod)
    assert main(["install-policy", str(prod), "--gpus", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"feddg install-policy: error: {prod / 'site-2' / 'local' / broken_file}: {problem}")
    assert len(err.strip().splitlines()) == 1
    assert _snapshot(prod) == before  # site-1 (read before site-2) and the server were not written either


def test_a_good_deployment_is_installed_in_every_kit_and_nothing_temporary_stays(tmp_path):
    prod = _deployment(tmp_path)
    written = install_site_policy(prod, num_gpus=1, mem_per_gpu_gib=24)
    assert {p.parent.parent.name for p in written} == {"server1", "site-1", "site-2"}
    for site in ("site-1", "site-2"):
        resources = json.loads((prod / site / "local" / "resources.json").read_text())
        assert PACKAGE_PREFIX in resources["class_allow_list"]
        assert resources["components"][0]["args"] == {"num_of_gpus": 1, "mem_per_gpu_in_GiB": 24}
        assert (prod / site / "local" / "privacy.json").exists()
    assert not (prod / "server1" / "local" / "privacy.json").exists()
    assert not [p for p in prod.rglob("*") if p.name.endswith(".tmp")]


def test_the_egress_limits_are_options_written_into_every_client_kit(tmp_path):
    prod = _deployment(tmp_path)
    assert main(["install-policy", str(prod), "--gpus", "0", "--max-half-width", "4", "--max-amplitude-images",
                 "200", "--max-feature-rows", "100"]) == 0
    for site in ("site-1", "site-2"):
        scope = json.loads((prod / site / "local" / "privacy.json").read_text())["scopes"][0]
        egress = scope["task_result_filters"][0]["args"]
        assert egress == {**egress_limits(), "max_half_width": 4, "max_amplitude_images": 200,
                          "max_feature_rows": 100}
        assert scope["task_data_filters"][0]["args"] == {"max_half_width": 4}  # incoming banks: the same cap


@pytest.mark.parametrize("option", ["--max-half-width", "--max-feature-rows", "--max-parameters"])
def test_a_limit_below_one_is_refused_by_name_and_nothing_is_written(tmp_path, capsys, option):
    prod = _deployment(tmp_path)
    before = _snapshot(prod)
    assert main(["install-policy", str(prod), "--gpus", "0", option, "0"]) == 2
    assert f"{option.removeprefix('--')}: must be a whole number of at least 1, got 0" in capsys.readouterr().err
    assert _snapshot(prod) == before


def test_the_deployment_page_shows_the_privacy_json_that_is_installed():
    page = (REPOSITORY / "docs" / "deployment.md").read_text()
    assert json.dumps(client_privacy(), indent=2) in page
