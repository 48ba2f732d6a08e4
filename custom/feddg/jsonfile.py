"""Small JSON files: state that must never be seen half-written (site state, GA history), and settings read strictly."""

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


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object a file holds; ValueError naming the file when it cannot be read, is not JSON or holds
    something else than an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {_JSON_KINDS.get(type(data), type(data).__name__)}")
    return data


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true/false",
               type(None): "null"}


def write_json(path: str | os.PathLike, data: Any, indent: int | None = None) -> None:
    """Write to a sibling temporary file, then rename it into place (atomic on one file system)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=indent)
    os.replace(tmp, path)
