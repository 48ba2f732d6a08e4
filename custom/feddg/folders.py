"""The one check before any command creates, clears or overwrites a folder (:func:`guard_folder`), and the marker
that says a folder is ours (:func:`claim`).

NVFlare's simulator and POC clear the workspace they are given, and several of our tools replace their output
folder; a mistyped option must never reach them. :func:`guard_folder` refuses, in one line naming the option and
the reason, before anything is touched:

* an empty value, the filesystem root, the home folder or a folder above it, the current folder or a folder above
  it;
* a git work tree (a folder holding ``.git``) or anything inside a ``.git`` folder;
* the repository's committed ``jobs/`` or a folder in it (only ``feddg make-jobs`` writing the template may);
* a folder that holds one of the command's inputs, or lies inside one (the job being run, the run being resumed);
* with ``whole`` (the command clears the folder or writes anywhere in it): a path that is a file, and a non-empty
  folder that this project did not make (no :data:`MARKER` in it), counting only what the clearing would remove
  (NVFlare's simulator keeps a workspace's ``local/`` and ``startup/``: :data:`SIMULATOR_KEEPS`). A folder that
  carries our marker may be cleared or filled again.

``whole=False`` is for commands that only add named entries to the folder and protect each entry themselves
(NVFlare's export replaces only a folder of the same job; ``feddg segment`` refuses to overwrite a mask without
``--overwrite``): the location rules above hold, the folder's other contents are not touched.

The marker is :data:`MARKER`, written by :func:`claim` right after a command creates or clears a folder. NVFlare's
simulator clears its workspace except ``local/`` and ``startup/``, so for a workspace it clears the marker goes
into ``local/`` (``claim(path, inside="local")``); both places count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

MARKER = ".feddg-folder"
# Where a marker may lie in a folder of ours: its top, or the local/ folder that NVFlare keeps when it clears a
# simulator workspace (simulator_runner._cleanup_workspace keeps local/ and startup/).
MARKER_PLACES = (MARKER, f"local/{MARKER}")
# What NVFlare's simulator keeps when it clears its workspace (simulator_runner._cleanup_workspace): a workspace
# holding only these is not someone else's folder, whoever made it.
SIMULATOR_KEEPS = ("local", "startup")
# The repository's committed job folders (a source checkout: custom/feddg/folders.py -> the repository root).
COMMITTED_JOBS = Path(__file__).resolve().parents[2] / "jobs"


class FolderRefused(ValueError):
    """A folder option that would create, clear or overwrite what the user did not ask to lose; the message is one
    line naming the option, the folder and the reason."""


def is_ours(path: Path) -> bool:
    """Whether ``path`` carries this project's marker (:data:`MARKER_PLACES`)."""
    return any((Path(path) / place).is_file() for place in MARKER_PLACES)


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def guard_folder(value: str | os.PathLike | None, option: str, *, inputs: Iterable[str | os.PathLike] = (),
                 whole: bool = True, template_jobs: bool = False, keeps: Iterable[str] = ()) -> Path:
    """``value`` as the absolute folder a command may create, clear or write into; :class:`FolderRefused` naming
    ``option`` and the reason otherwise (the rules: the module docstring). Nothing is created or changed here.

    Args:
        value: the folder as the user gave it.
        option: the option's name as the user typed it (``-w``, ``--out``), for the message.
        inputs: what the command reads (a job folder, a previous run): the folder may neither hold one nor lie in
            one.
        whole: the command clears the folder or writes anywhere in it (see the module docstring).
        template_jobs: ``feddg make-jobs`` writing the template itself into the committed ``jobs/``.
        keeps: entries of the folder that its clearing leaves alone (:data:`SIMULATOR_KEEPS`): they do not make it
            a folder of someone else's (a user's own ``local/feddg_site.json`` in a simulator workspace).
    """
    text = "" if value is None else os.fspath(value)
    if not text.strip():
        raise FolderRefused(f"{option} is empty: give a folder")
    path = Path(text).expanduser().resolve()

    def refuse(why: str) -> FolderRefused:
        return FolderRefused(f"{option} {text!r} ({path}) {why}; nothing was changed")

    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if path == Path(path.anchor):
        raise refuse("is the filesystem root: give a folder of its own")
    if _is_within(home, path):
        raise refuse("is your home folder or holds it: give a folder of its own")
    if _is_within(cwd, path):
        what = "is the current folder" if path == cwd else "holds the current folder"
        raise refuse(f"{what}: give a folder of its own")
    if ".git" in path.parts:
        raise refuse("is inside a .git folder")
    if (path / ".git").exists():
        raise refuse("is a git work tree: give a folder of its own")
    jobs = COMMITTED_JOBS.resolve()
    if not template_jobs and _is_within(path, jobs):
        raise refuse(f"is in the repository's committed {jobs}, which only `feddg make-jobs` writes")
    for given in inputs:
        source = Path(given).expanduser().resolve()
        if _is_within(source, path):
            raise refuse(f"holds this command's input {source}")
        if _is_within(path, source):
            raise refuse(f"is inside this command's input {source}")
    if path.exists() and not path.is_dir():
        raise refuse("is a file, not a folder")
    kept = set(keeps)
    if whole and path.is_dir() and not is_ours(path) and any(p.name not in kept for p in path.iterdir()):
        raise refuse(f"is not empty and was not made by feddg (no {MARKER} in it): give a new or empty folder; if "
                     f"feddg made it, `touch {path / MARKER}` lets feddg clear it")
    return path


def claim(path: str | os.PathLike, by: str, inside: str = "") -> Path:
    """Create ``path`` (and its parents) if needed and mark it as ours (:data:`MARKER`, in ``path/inside``); the
    marker records which command made it. Call it right after :func:`guard_folder` passed."""
    folder = Path(path) / inside if inside else Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    if not marker.is_file():
        marker.write_text(json.dumps({"made_by": by, "created": datetime.now(timezone.utc).isoformat(
            timespec="seconds")}) + "\n")
    return Path(path)
