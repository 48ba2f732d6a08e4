"""Small JSON state files that must never be seen half-written (site state, GA history)."""

from __future__ import annotations

import json
import os
from typing import Any


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """The file's object, or {} when it is missing or unreadable."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: str | os.PathLike, data: Any, indent: int | None = None) -> None:
    """Write to a sibling temporary file, then rename it into place (atomic on one file system)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=indent)
    os.replace(tmp, path)
