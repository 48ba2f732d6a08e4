"""Small JSON files: state that must never be seen half-written (site state, GA history), and settings read strictly."""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
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


def write_json(path: str | os.PathLike, data: Any, indent: int | None = None, finite: bool = False) -> None:
    """Write to a sibling temporary file, then rename it into place (atomic on one file system). ``finite`` (a
    result file: a benchmark's tables, a run's record): ValueError naming the file, and nothing written, when
    ``data`` holds NaN or an infinity, which strict JSON readers refuse and no measured number is."""
    try:
        text = json.dumps(data, indent=indent, allow_nan=not finite)
    except ValueError as e:
        raise ValueError(f"{path}: not written: {e} (a result file holds no NaN or Infinity)") from None
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


_DROP = object()


def json_safe(data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that JSON holds as they are: strings, finite numbers (numpy's included, as Python
    numbers), booleans, null, and lists and string-keyed mappings of them. Anything else is dropped: an entry of
    another kind (an array, an object), a NaN or infinite number (a strict JSON writer refuses it), a key that is
    not a string, and a list with any such element (not just the element, which would shift the others)."""
    out = _plain(dict(data))
    return out if isinstance(out, dict) else {}


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else _DROP
    if isinstance(value, Mapping):
        items = {k: _plain(v) for k, v in value.items() if isinstance(k, str)}
        return {k: v for k, v in items.items() if v is not _DROP}
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _DROP if any(v is _DROP for v in items) else items
    return _DROP
