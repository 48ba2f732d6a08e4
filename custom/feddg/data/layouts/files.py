"""File-system guards: every failure to examine, list or read a path becomes a DataError naming it.

Nothing is skipped silently: a symbolic link that cannot be followed, a folder the OS refuses to list and a file it
refuses to read are problems naming the path, like a missing or corrupt file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DataError, os_reason


def _link_target(path: Path) -> str | None:
    """Where the symbolic link ``path`` points; None when it is no link (or cannot be examined)."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def exists(path: Path, site: str | None) -> bool:
    """Whether ``path`` can be used; False when nothing is there.

    Raises DataError naming the path for a symbolic link that cannot be followed (dangling or looping: skipping it
    would silently drop data) and for a path the OS refuses to examine (permissions).
    """
    try:
        path.stat()
    except OSError as e:
        target = _link_target(path)
        if isinstance(e, FileNotFoundError) and target is None:
            return False
        reason = f"cannot access ({os_reason(e)})"
        if target is not None:
            reason = f"broken symbolic link (points to {target!r}: {os_reason(e)})"
        raise DataError(reason, site=site, paths=[path]) from e
    return True


def is_dir(path: Path, site: str | None) -> bool:
    """Whether ``path`` is a usable folder; DataError as :func:`exists`."""
    return exists(path, site) and path.is_dir()


def list_dir(folder: Path, site: str | None) -> list[Path]:
    """The entries of ``folder`` in name order; DataError naming it and the OS's reason when it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as e:
        raise DataError(f"cannot list folder ({os_reason(e)})", site=site, paths=[folder]) from e


def site_folders(root: Path) -> list[str]:
    """The sites of a data folder: the names of ``root``'s visible sub-folders, in name order.

    An entry that cannot be examined (a dangling or looping symbolic link, no permission) is listed too, so that
    scanning that site reports why. Raises DataError when ``root`` is missing, not a folder or cannot be listed.
    """
    root = Path(root)
    if not is_dir(root, None):
        raise DataError("data root folder does not exist" if not root.exists() else "data root is not a folder",
                        paths=[root])
    names = []
    for p in list_dir(root, None):
        if p.name.startswith("."):
            continue
        try:
            usable = is_dir(p, p.name)
        except DataError:
            usable = True  # scan_site reports it, under the site's name
        if usable:
            names.append(p.name)
    return names


@contextmanager
def reading(path: Path, site: str | None, what: str) -> Iterator[None]:
    """Turn any failure to read ``path`` into a DataError naming it (PIL, nibabel, gzip and the OS raise many types)."""
    try:
        yield
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"cannot read {what} file ({os_reason(e)})", site=site, paths=[path]) from e
