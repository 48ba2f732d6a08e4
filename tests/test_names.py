"""Names used across modules are spelled once: each file name and optimizer setting below has one home, and every
other module of the package and of benchmarks/ imports it from there. Read from the source with ``ast``: string
constants (docstrings excepted) and call arguments, so a name typed out again anywhere is found."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.conftest import REPOSITORY

SOURCES = sorted([*(REPOSITORY / "custom" / "feddg").rglob("*.py"), *(REPOSITORY / "benchmarks").glob("*.py")])

# literal -> the one file that may spell it
HOMES = {
    "feddg_report.json": "custom/feddg/report.py",
    "simulate_job": "custom/feddg/flare/constants.py",
}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and of its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_in(literal: str, sources: list[Path], root: Path = REPOSITORY) -> list[str]:
    """Each file (relative to ``root``) with a string constant, not a docstring, that contains ``literal``."""
    found = []
    for path in sources:
        tree = ast.parse(path.read_text())
        skip = docstrings(tree)
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and literal in n.value and id(n) not in skip
               for n in ast.walk(tree)):
            found.append(path.relative_to(root).as_posix())
    return found


def adam_betas_in(sources: list[Path], root: Path = REPOSITORY) -> list[str]:
    """Each file with a call that passes Adam's ``betas`` (keyword, or the third positional argument of Adam)."""
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if any(k.arg == "betas" for k in node.keywords) or (name == "Adam" and len(node.args) >= 3):
                found.append(path.relative_to(root).as_posix())
                break
    return found


@pytest.mark.parametrize("literal", sorted(HOMES))
def test_each_shared_file_name_is_spelled_in_one_module(literal):
    assert spelled_in(literal, SOURCES) == [HOMES[literal]]


def test_the_local_optimizer_setting_has_one_home():
    assert adam_betas_in(SOURCES) == ["custom/feddg/training.py"]


def test_the_checks_find_a_name_typed_out_again(tmp_path):
    """Each check finds a module that spells the name in its code, and not one that names it in a docstring."""
    docs = tmp_path / "docs.py"
    docs.write_text('"""Writes feddg_report.json into server/simulate_job."""\n\n\n'
                    'def f():\n    """Adam with betas (0.9, 0.99)."""\n')
    code = tmp_path / "code.py"
    code.write_text('import torch\n\nREPORT = "feddg_report.json"\nRUN = f"server/simulate_job/{REPORT}"\n'
                    'one = torch.optim.Adam([], 1e-3, (0.9, 0.99))\n')
    other = tmp_path / "other.py"
    other.write_text('import torch\n\nopt = torch.optim.AdamW([], lr=1e-3, betas=(0.9, 0.999))\n')
    for literal in HOMES:
        assert spelled_in(literal, [docs, code], tmp_path) == ["code.py"]
    assert adam_betas_in([docs, code, other], tmp_path) == ["code.py", "other.py"]


def test_the_simulator_job_name_is_nvflares():
    from nvflare.private.fed.simulator.simulator_const import SimulatorConstants

    from feddg.flare.constants import SIMULATOR_JOB

    assert SIMULATOR_JOB == SimulatorConstants.JOB_NAME


def test_the_local_optimizer_is_adam_with_the_papers_betas():
    import torch

    from feddg.training import LOCAL_ADAM_BETAS, local_optimizer

    optimizer = local_optimizer([torch.nn.Parameter(torch.zeros(2))], 1e-3)
    assert isinstance(optimizer, torch.optim.Adam)
    assert optimizer.defaults["lr"] == 1e-3 and optimizer.defaults["betas"] == LOCAL_ADAM_BETAS == (0.9, 0.99)
