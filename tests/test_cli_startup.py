"""``feddg --help`` and ``feddg <command> --help`` start at once: the parser is built from import-light declarations
(the registry's methods and site limits, the rehearsal's options, the schema's choices) and each command imports
what it runs only when it runs. Checked in a fresh interpreter per command, on the modules loaded when it exits."""

from __future__ import annotations

import pytest

from tests.imports import heavy_imports, probe

# Runs `feddg ARGS...` as the console script does (none of the heavy packages is needed to print its options).
CLI = "from feddg.cli import main\nsys.exit(main(sys.argv[1:]))"


def commands() -> list[str]:
    from feddg.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


def heavy_modules_after(args: list[str]) -> tuple[int, str, list[str]]:
    """(exit status, output, heavy packages loaded) of ``feddg ARGS`` in a fresh interpreter."""
    proc, loaded = probe(CLI, args)
    return proc.returncode, proc.stdout, loaded


def test_the_commands_are_found():
    assert {"check-data", "benchmark", "install-policy", "rehearse-network", "simulate"} <= set(commands())


@pytest.mark.parametrize("args", [["--help"], *([c, "--help"] for c in commands())], ids=" ".join)
def test_help_imports_no_training_or_flare_stack(args):
    code, out, loaded = heavy_modules_after(args)
    assert code == 0 and "usage: feddg" in out
    assert loaded == [], f"feddg {' '.join(args)} imported {loaded}"


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a run that does import one of them is seen."""
    _, loaded = probe(CLI.replace("from feddg.cli import main", "from feddg.cli import main\nimport monai"), ["--help"])
    assert loaded == ["monai", "torch"]  # MONAI brings torch with it


def test_heavy_imports_sees_a_heavy_import():
    """The helper the registry's and the sweep options' import tests use can fail: an import it must see is seen."""
    assert heavy_imports("import json") == []
    assert heavy_imports("import monai") == ["monai", "torch"]  # MONAI brings torch with it

