"""Shared fixtures: tiny synthetic sites written once per test session, and tiny experiment configs."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from feddg.config import SyntheticConfig
from feddg.experiment import TASK_DEFAULTS
from feddg.flare import registry  # noqa: F401 - every test validates with the methods' sections registered
from feddg.rehearsal.network import missing_privileges

# As feddg.nets.unet.select_device does for the sites: denormal floats make small CPU nets ~20x slower.
torch.set_flush_denormal(True)

REPOSITORY = Path(__file__).resolve().parents[1]
SHARED_DATA = REPOSITORY.parent / "shared" / "data" / "midss-samples"

# Tiny sizes for component and end-to-end tests: 32 px, a narrow U-Net, one round of one epoch.
TINY_MODEL = {"features": [8, 8, 16, 32, 64, 8], "norm": "batch", "dropout": 0.0}


# The network rehearsal's tests need root (network namespaces). They skip on a machine that cannot make them, unless
# FEDDG_REQUIRE_NETNS is set: .ci/run sets it where it can make a namespace, so there a missing privilege fails the
# tests instead of skipping them silently.
needs_netns = pytest.mark.skipif(
    bool(missing_privileges()) and not os.environ.get("FEDDG_REQUIRE_NETNS"),
    reason="network namespaces need root and iproute2 (FEDDG_REQUIRE_NETNS unset)")


# Tests that start a POC or a deployment listen on NVFlare's fixed ports (feddg.provisioning.FED_LEARN_PORT and
# ADMIN_PORT), so they run one at a time: with the README's `pytest -n 2` (and `--dist loadgroup` from pyproject.toml)
# pytest-xdist gives every test of this group to one worker, in turn, while the other worker runs the rest.
on_poc_ports = pytest.mark.xdist_group("poc_ports")


def foreign_package(repository: Path, package_file: str | Path) -> str | None:
    """Why these tests must not run with the installed ``feddg`` (None when it is ``repository``'s own source).

    The tests exercise the checkout they are in, and the package guards that checkout's committed ``jobs/`` through
    a path it derives from its own location (``feddg.folders.COMMITTED_JOBS``): with ``feddg`` installed from another
    checkout, or as a wheel, the tests would run other code, and the guard would protect the other copy's folder
    while tests that expect a refusal wrote into this checkout's ``jobs/``.
    """
    package = Path(package_file).resolve().parent
    source = repository.resolve() / "custom" / "feddg"
    if package == source:
        return None
    return (f"these tests are {repository}'s, but Python imports feddg from {package} (another checkout or an "
            f"installed copy): run `pip install -e {repository}` (README) and run them again")


def pytest_configure(config: pytest.Config) -> None:
    import feddg

    reason = foreign_package(REPOSITORY, feddg.__file__)
    if reason:
        raise pytest.UsageError(reason)


def tiny_synthetic(task: str) -> dict:
    if task == "prostate":
        return {"seed": 0, "cases_per_site": 3, "slices_per_case": 4, "size": 32}
    return {"seed": 0, "cases_per_site": 4, "slices_per_case": 1, "size": 32}


def tiny_experiment(task: str, root: str | None = None, **train) -> dict:
    """A full feddg.yaml dict for ``task`` at test size."""
    exp = copy.deepcopy(TASK_DEFAULTS[task])
    exp["data"].update(image_size=32, root=root, synthetic=tiny_synthetic(task))
    exp["model"] = dict(TINY_MODEL)
    exp["train"].update({"rounds": 1, "local_epochs": 1, "batch_size": 4, **train})
    exp["eval"]["batch_size"] = 8
    return exp


# The unseen site's cases in tests that run a sweep or a benchmark script: their protocol enlarges it
# (feddg.benchmark.sweep's SYNTHETIC_HELD_OUT_CASES) for narrow intervals, which a test does not need.
TINY_HELD_OUT_CASES = 6


def _departures(value: Any, default: Any) -> Any:
    """The parts of the nested ``value`` that differ from ``default`` (an empty dict where none does)."""
    if isinstance(value, dict) and isinstance(default, dict):
        parts = {key: _departures(item, default.get(key)) for key, item in value.items() if item != default.get(key)}
        return {key: item for key, item in parts.items() if item != {}}
    return value


def tiny_overrides(task: str, held_out_cases: int | None = None, **train: Any) -> dict:
    """The overrides that make ``task``'s defaults :func:`tiny_experiment`'s data, model and evaluation settings, as
    nested as ``feddg.yaml``; ``held_out_cases`` and ``train`` only as given (a script or sweep under test sets its
    own rounds, and a protocol its own unseen-site size)."""
    tiny = tiny_experiment(task)
    out = _departures({section: tiny[section] for section in ("data", "model", "eval")}, TASK_DEFAULTS[task])
    if held_out_cases is not None:
        out["data"].setdefault("synthetic", {})["held_out_cases"] = held_out_cases
    if train:
        out["train"] = dict(train)
    return out


def as_sets(overrides: dict, _prefix: str = "") -> list[str]:
    """Nested ``overrides`` as the command line's options, ``["--set", "data.image_size=32", ...]``: a string as it
    is, any other value as JSON, which ``feddg.experiment.parse_overrides`` reads back as YAML."""
    options = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            options += as_sets(value, f"{_prefix}{key}.")
        else:
            options += ["--set", f"{_prefix}{key}={value if isinstance(value, str) else json.dumps(value)}"]
    return options


def tiny_sets(task: str, held_out_cases: int | None = None, **train: Any) -> list[str]:
    """:func:`tiny_overrides` as ``--set`` options, for tests that run the command line and the scripts."""
    return as_sets(tiny_overrides(task, held_out_cases, **train))


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory):
    """task -> folder of tiny synthetic sites in the task's real layout."""
    from feddg.data.synthetic import generate

    roots = {}
    for task in ("prostate", "fundus"):
        out = tmp_path_factory.mktemp(f"synthetic-{task}")
        generate(task, out, SyntheticConfig(**tiny_synthetic(task)))
        roots[task] = out
    return roots


LOOPBACK_SITES = ["BIDMC", "BMC", "RUNMC"]


@pytest.fixture(scope="session")
def loopback_kits(tmp_path_factory):
    """Real kits of a loopback project (``nvflare poc prepare`` with the consortium's project and the site policy),
    not started: the server's, every hospital's and every admin's kit, for tests that check kits and roles."""
    from feddg.poc import prepare

    return prepare(tmp_path_factory.mktemp("loopback_kits") / "poc", "prostate", LOOPBACK_SITES)


def lead_kit_to_closed_port(kits, folder: Path) -> tuple[Path, int]:
    """A copy of the loopback project's lead admin kit in ``folder`` whose server address is a closed loopback
    port: (the kit, the port)."""
    import json
    import shutil

    kit = Path(folder) / "lead_kit"
    shutil.copytree(kits.kit(kits.lead), kit)
    config = kit / "startup" / "fed_admin.json"
    admin = json.loads(config.read_text())
    port = closed_port()
    admin["admin"].update(host="127.0.0.1", port=port)
    config.write_text(json.dumps(admin))
    return kit, port


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, and closed again)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
