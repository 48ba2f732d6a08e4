"""``feddg --help`` and ``feddg <command> --help`` start at once: the parser is built from import-light declarations
(the registry's methods and site limits, the rehearsal's options, the schema's choices) and each command imports
what it runs only when it runs. Checked in a fresh interpreter per command, on the modules loaded when it exits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.imports import HEAVY, heavy_imports  # none of HEAVY is needed to print a command's options


# Runs `feddg ARGS...` as the console script does, then prints the heavy packages loaded by then as one JSON line.
PROBE = """
import json, sys
from feddg.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as e:
    code = e.code
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[1])))
print("\\nLOADED " + json.dumps(loaded))
sys.exit(code)
"""


def commands() -> list[str]:
    from feddg.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


def heavy_modules_after(args: list[str]) -> tuple[int, str, list[str]]:
    """(exit status, output, heavy packages loaded) of ``feddg ARGS`` in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), *args], capture_output=True, text=True,
                          timeout=120)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("LOADED ")]
    assert marker, f"feddg {' '.join(args)} did not finish: {proc.stderr[-2000:]}"
    return proc.returncode, proc.stdout, json.loads(marker[-1].removeprefix("LOADED "))


def test_the_commands_are_found():
    assert {"check-data", "benchmark", "install-policy", "rehearse-network", "simulate"} <= set(commands())


@pytest.mark.parametrize("args", [["--help"], *([c, "--help"] for c in commands())], ids=" ".join)
def test_help_imports_no_training_or_flare_stack(args):
    code, out, loaded = heavy_modules_after(args)
    assert code == 0 and "usage: feddg" in out
    assert loaded == [], f"feddg {' '.join(args)} imported {loaded}"


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a run that does import one of them is seen."""
    proc = subprocess.run([sys.executable, "-c", PROBE.replace("from feddg.cli import main",
                                                                "from feddg.cli import main\nimport monai"),
                           json.dumps(HEAVY), "--help"], capture_output=True, text=True, timeout=120)
    assert '"monai"' in proc.stdout and '"torch"' in proc.stdout  # MONAI brings torch with it


def test_heavy_imports_sees_a_heavy_import():
    """The helper the registry's and the sweep options' import tests use can fail: an import it must see is seen."""
    assert heavy_imports("import json") == []
    assert heavy_imports("import monai") == ["monai", "torch"]  # MONAI brings torch with it

