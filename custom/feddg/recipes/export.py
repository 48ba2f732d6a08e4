"""The recipes' exports as job folders: what ``feddg make-jobs`` writes into ``jobs/`` and checks it against.

A job folder is up to date when it holds exactly the files of its recipe's export, byte for byte: a changed or
missing file is drift, and so is an extra one (an ``app/custom`` folder would make the job bring-your-own-code).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from feddg.recipes.recipe import FedDGRecipe, split_job


def recipe_for(name: str, overrides: Mapping[str, Any] | None = None) -> FedDGRecipe:
    """The recipe of the job ``name`` (``<task>_<method>``), with ``overrides``; ValueError listing the known jobs
    for an unknown one."""
    task, method = split_job(name)
    return FedDGRecipe(task, method, overrides, name=name)


def export_job(name: str, out_dir: Path, overrides: Mapping[str, Any] | None = None) -> Path:
    """Export the job ``name`` (with ``overrides``) to ``out_dir/name`` and return that folder. NVFlare replaces a
    folder of the same job there as a whole (RuntimeError when a folder of that name holds another job)."""
    recipe_for(name, overrides).export(str(out_dir))
    return Path(out_dir) / name


def folder_files(folder: Path) -> dict[str, bytes]:
    """Relative POSIX path -> content of every file under ``folder``."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def job_files(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Relative path -> text of every file of the job ``name``'s export (with ``overrides``)."""
    with tempfile.TemporaryDirectory() as tmp:
        return {rel: content.decode() for rel, content in folder_files(export_job(name, Path(tmp), overrides)).items()}


def stale_jobs(jobs_dir: Path, names: Iterable[str]) -> list[str]:
    """The paths under ``jobs_dir/<name>`` (for each of ``names``) that are not what the recipe exports: files that
    differ or are missing, and files the export does not have. Empty when every folder is up to date."""
    stale: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            expected = folder_files(export_job(name, Path(tmp)))
            have = folder_files(Path(jobs_dir) / name) if (Path(jobs_dir) / name).is_dir() else {}
            for rel in sorted(set(expected) | set(have)):
                if expected.get(rel) != have.get(rel):
                    stale.append(str(Path(jobs_dir) / name / rel))
    return stale
