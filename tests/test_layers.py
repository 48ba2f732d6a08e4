"""Imports run one way: a module imports only from its own layer or the layers below it, the papers' math
(``feddg.methods``) imports nothing else from the package, and two method folders of the NVFlare glue
(``feddg.flare.<method>/``) never import each other, and no module imports itself back through others (no import
cycle: a part and its payload contract share their names through a module of plain values, the recipes import the
job template and not the other way round). Read from the source with ``ast``, so a lazy import inside a function
counts as much as one at the top.

The layers, lowest first (docs/code-layout.md, "Layout of the code", describes them):
  0. base: the package root, the experiment schema and small utilities every layer uses;
  1. data, nets, the papers' math and the metrics;
  2. training, evaluation and reports;
  3. the NVFlare glue (``flare/``);
  4. tools: the job generator, the CLI, the POC and the network rehearsal, provisioning, resuming, inference.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import REPOSITORY

PACKAGE = REPOSITORY / "custom" / "feddg"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("feddg", "feddg.config", "feddg.experiment", "feddg.layouts", "feddg.jsonfile", "feddg.seeds",
              "feddg.compute", "feddg.precision", "feddg.folders", "feddg.numbers", "feddg.numerics")),
    ("data, nets, methods", ("feddg.data", "feddg.nets", "feddg.methods", "feddg.metrics")),
    ("training and evaluation", ("feddg.training", "feddg.evaluation", "feddg.report")),
    ("flare", ("feddg.flare",)),
    ("tools", ("feddg.jobs", "feddg.recipes", "feddg.cli", "feddg.simulate", "feddg.poc", "feddg.provisioning",
               "feddg.resume", "feddg.inference", "feddg.benchmark", "feddg.rehearsal", "feddg.docs_reference")),
]
PURE = "feddg.methods"  # imports nothing from the package but itself
METHOD_FOLDERS = "feddg.flare"  # its sub-packages are method folders, which never import each other


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, root: Path) -> set[str]:
    """Every ``feddg`` module that the file at ``path`` (module ``name``) imports, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            # ``from feddg.flare import elcfs`` imports the sub-package feddg.flare.elcfs, ``from feddg.flare.mla
            # import part`` the module feddg.flare.mla.part
            folder = root.parent / module.replace(".", "/")
            found |= {f"{module}.{alias.name}" for alias in node.names
                      if (folder / alias.name).is_dir() or (folder / f"{alias.name}.py").is_file()}
    return {m for m in found if m == "feddg" or m.startswith("feddg.")}


def layer_of(module: str) -> int:
    """The layer of ``module``: the entry with the longest matching prefix. KeyError for a module in no layer."""
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    if best is None:
        raise KeyError(module)
    return best


def method_folder(module: str, root: Path) -> str | None:
    """``feddg.flare.<x>`` when ``module`` lies inside the method folder ``<x>`` (a sub-package of flare)."""
    parts = module.split(".")
    if len(parts) >= 3 and ".".join(parts[:2]) == METHOD_FOLDERS:
        folder = ".".join(parts[:3])
        if (root.parent / folder.replace(".", "/")).is_dir():
            return folder
    return None


def violations(root: Path) -> list[str]:
    """Every import that breaks the rules, as ``importer -> imported: rule``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        for target in sorted(imported_modules(path, name, root)):
            if target == name:
                continue
            if layer_of(target) > layer_of(name):
                found.append(f"{name} -> {target}: {LAYERS[layer_of(name)][0]} imports from the higher layer "
                             f"{LAYERS[layer_of(target)][0]}")
            if name.startswith(PURE + ".") and not (target == PURE or target.startswith(PURE + ".")):
                found.append(f"{name} -> {target}: the papers' math imports nothing else from the package")
            mine, theirs = method_folder(name, root), method_folder(target, root)
            if mine and theirs and mine != theirs:
                found.append(f"{name} -> {target}: method folders never import each other")
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """The package's import cycles: each strongly connected group of two or more modules of the import graph
    (Tarjan's algorithm, iterative), its modules sorted; an import of a package counts as one of its
    ``__init__``."""
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph = {name: sorted(m for m in imported_modules(path, name, root) if m in files and m != name)
             for name, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        cycles.append(sorted(group))
    return sorted(cycles)


def test_no_import_cycles():
    assert import_cycles(PACKAGE) == []


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import(tmp_path):
    root = tmp_path / "feddg"
    shutil.copytree(PACKAGE, root)
    names = root / "flare" / "mla" / "names.py"
    names.write_text(names.read_text() + "\n\ndef late():\n    from feddg.flare.mla import part\n")
    assert import_cycles(root) == [["feddg.flare.mla.names", "feddg.flare.mla.part", "feddg.flare.mla.payloads"]]


LONG_MODULE = 450  # lines; a longer module says why it is one module


def test_a_long_module_says_why_it_is_one():
    """A module over :data:`LONG_MODULE` lines is split by concern, or its docstring says "Why one module:"."""
    long = [f"{path.relative_to(PACKAGE)} ({n} lines)" for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > LONG_MODULE
            and "Why one module:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert long == [], "split these modules, or say why each is one (in its docstring, 'Why one module:')"


def test_every_module_has_a_layer():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        try:
            layer_of(module_name(path, PACKAGE))
        except KeyError as e:
            missing.append(str(e))
    assert missing == [], "place these modules in a layer (tests/test_layers.py and docs/code-layout.md)"


def test_imports_run_one_way():
    assert violations(PACKAGE) == []


@pytest.mark.parametrize("source,target,rule", [
    ("feddg/flare/persistor.py", "from feddg.jobs import JOBS\n", "imports from the higher layer tools"),
    ("feddg/methods/ga.py", "def f():\n    from feddg.config import TASKS\n", "imports nothing else"),
    ("feddg/data/layouts/registry.py", "from ...flare import constants\n", "imports from the higher layer flare"),
])
def test_the_check_finds_each_kind_of_violation(tmp_path, source, target, rule):
    """The rules are checked on a copy of the package with one bad import added."""
    root = tmp_path / "feddg"
    shutil.copytree(PACKAGE, root)
    (root / source.removeprefix("feddg/")).write_text(target)
    assert any(rule in v for v in violations(root))


def test_method_folders_never_import_each_other(tmp_path):
    root = tmp_path / "feddg"
    shutil.copytree(PACKAGE, root)
    for folder in ("alpha", "beta"):
        (root / "flare" / folder).mkdir()
        (root / "flare" / folder / "__init__.py").write_text("")
    (root / "flare" / "beta" / "executor.py").write_text("from feddg.flare.alpha import thing\n")
    assert violations(root) == ["feddg.flare.beta.executor -> feddg.flare.alpha: method folders never import "
                                "each other"]


HEAVY = ("torch", "nvflare", "ray", "monai")
IMPORT_LIGHT = ["feddg.flare.method_spec", "feddg.flare.registry", "feddg.flare.site_limits", "feddg.rehearsal.options",
                "feddg.benchmark.executors"] + sorted(
    module_name(path, PACKAGE) for pattern in ("flare/*/part.py", "flare/*/settings.py")
    for path in PACKAGE.glob(pattern))


def test_the_modules_the_cli_reads_at_start_up_import_no_heavy_package():
    """Each method's ``part.py`` and ``settings.py``, the registry and the modules whose docstrings promise it load
    none of :data:`HEAVY` (docs/code-layout.md): a lazy import inside a function keeps a helper's torch out."""
    script = ("import importlib, sys\n"
              f"for name in {IMPORT_LIGHT!r}:\n"
              "    importlib.import_module(name)\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert len(IMPORT_LIGHT) > 10 and done.stdout.strip() == "[]"
