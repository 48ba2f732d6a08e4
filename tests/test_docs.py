"""The documentation: the pages in docs/ build with MkDocs in strict mode (a broken link or anchor, a page missing
from nav or a link out of docs/ fails), and the front page (README.md) stays short and links every page.

The build needs mkdocs-material (the ``docs`` extra, which CI installs; .ci/run also runs the build itself). Where it
is missing the build tests are skipped with the reason, except under CI (``CI`` set), where they fail."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.conftest import REPOSITORY

README_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        reason = 'mkdocs-material is not installed (pip install -e ".[docs]")'
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must build the documentation")
        pytest.skip(reason)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def _nav_pages(config: Path) -> list[str]:
    """The pages mkdocs.yml's nav lists, in order."""
    def walk(entries: list) -> list[str]:
        out = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            out += walk(value) if isinstance(value, list) else [value]
        return out
    return walk(yaml.safe_load(config.read_text())["nav"])


def test_the_pages_build_in_strict_mode(tmp_path):
    built = _mkdocs_build(REPOSITORY / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    assert (tmp_path / "site" / "reference" / "feddg-yaml" / "index.html").is_file()


def test_a_broken_link_an_unknown_anchor_a_link_out_of_docs_and_a_page_left_out_of_nav_fail_the_build(tmp_path):
    """The strictness is mkdocs.yml's (its validation settings): checked on a copy with one problem of each kind."""
    shutil.copytree(REPOSITORY / "docs", tmp_path / "docs")
    shutil.copy(REPOSITORY / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in nav\n")
    with (tmp_path / "docs" / "gpu.md").open("a") as page:
        page.write("\n[gone](no-such-page.md) [anchor](methods.md#no-such-heading) "
                        "[repository file](../benchmarks/results/round_time_cpu.md)\n")
    built = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    for problem in ("'no-such-page.md', but the target is not found",
                    "does not contain an anchor '#no-such-heading'",
                    "'../benchmarks/results/round_time_cpu.md', but the target is not found",
                    "not included in the \"nav\" configuration", "orphan.md"):
        assert problem in built.stderr, built.stderr


def test_every_page_is_in_nav_and_the_front_page_links_each_one():
    pages = sorted(str(p.relative_to(REPOSITORY / "docs")) for p in (REPOSITORY / "docs").rglob("*.md"))
    nav = _nav_pages(REPOSITORY / "mkdocs.yml")
    assert sorted(nav) == pages
    readme = (REPOSITORY / "README.md").read_text()
    linked = {target.split("#")[0].removeprefix("docs/") for target in LINK.findall(readme)
              if target.startswith("docs/")}
    assert linked == set(nav) - {"index.md"}, "README.md's 'Where to go next' must link every page"


def test_the_front_page_is_short_and_its_links_resolve():
    readme = (REPOSITORY / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    local = [t for t in LINK.findall(readme) if not t.startswith(("http://", "https://", "#"))]
    assert local and [t for t in local if not (REPOSITORY / t.split("#")[0]).is_file()] == []
