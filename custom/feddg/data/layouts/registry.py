"""From a layout's name to its declaration (:data:`feddg.layouts.LAYOUTS`) and to the code it names.

The declaration sits in the import-light base layer and names its scanner and decoder as ``"module:function"``;
they are imported here, in the data layer, on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from typing import Any

from feddg.layouts import LAYOUTS, Layout

from ..errors import DataError


def layout_spec(layout: str) -> Layout:
    """The declaration of ``layout``; DataError naming the known layouts when it is unknown."""
    try:
        return LAYOUTS[layout]
    except KeyError:
        raise DataError(f"unknown data layout {layout!r}; known layouts are {sorted(LAYOUTS)}") from None


@cache
def implementation(path: str) -> Callable[..., Any]:
    """The function a declaration names as ``"package.module:function"``, imported once.

    Raises ImportError or AttributeError naming the path when it does not lead to a callable (a declaration that
    does not match the code; ``tests/data/test_layout_declaration.py`` resolves every declared path).
    """
    module_name, _, function_name = path.partition(":")
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        raise AttributeError(f"layout code {path!r}: module {module_name} has no function {function_name!r}")
    return function
