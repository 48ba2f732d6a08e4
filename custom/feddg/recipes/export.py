"""The recipes' exports as job folders: what ``feddg make-jobs`` writes into ``jobs/`` and checks it against.

A job folder is up to date when it holds exactly the files of its recipe's export, byte for byte: a changed or
missing file is drift, and so is an extra one (an ``app/custom`` folder would make the job bring-your-own-code).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from feddg.jobs import JOBS
from feddg.recipes.recipe import FedDGRecipe, split_job


def recipe_for(name: str, overrides: Mapping[str, Any] | None = None) -> FedDGRecipe:
    """The recipe of the job ``name`` (``<task>_<method>``), with ``overrides``; ValueError listing the known jobs
    for an unknown one."""
    task, method = split_job(name)
    return FedDGRecipe(task, method, overrides, name=name)


def write_job(out_dir: Path, name: str, overrides: Mapping[str, Any] | None = None) -> Path:
    """Export the job ``name``'s recipe (with ``overrides``) to ``out_dir/name`` and return that folder. NVFlare
    replaces a folder of the same job there as a whole (RuntimeError when a folder of that name holds another
    job). The job template (:mod:`feddg.jobs`) says what a job is; this is where a job folder is written from it."""
    recipe_for(name, overrides).export(str(out_dir))
    return Path(out_dir) / name


def folder_files(folder: Path) -> dict[str, bytes]:
    """Relative POSIX path -> content of every file under ``folder``."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def job_files(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Relative path -> text of every file of the job ``name``'s export (with ``overrides``)."""
    with tempfile.TemporaryDirectory() as tmp:
        return {rel: content.decode() for rel, content in folder_files(write_job(Path(tmp), name, overrides)).items()}


def stale_jobs(jobs_dir: Path, names: Iterable[str] = JOBS) -> list[str]:
    """The paths under ``jobs_dir/<name>`` (for each of ``names``, by default the committed jobs) that are not what
    the recipe exports: files that differ or are missing, and files the export does not have (an ``app/custom``
    folder is drift). Empty when every folder is up to date."""
    stale: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            expected = folder_files(write_job(Path(tmp), name))
            have = folder_files(Path(jobs_dir) / name) if (Path(jobs_dir) / name).is_dir() else {}
            for rel in sorted(set(expected) | set(have)):
                if expected.get(rel) != have.get(rel):
                    stale.append(str(Path(jobs_dir) / name / rel))
    return stale
