"""Checks that a set of weights fits a network before it is used (pure numpy): a site's model update before it
may touch the global model, and a saved checkpoint before it is loaded (:func:`feddg.inference.read_checkpoint`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

NAMES_SHOWN = 3  # parameter names quoted in a message, per kind of mismatch


class UpdateRejected(ValueError):
    """A set of weights does not fit its reference; the message says why (never the values themselves)."""


def check_update(update: Mapping[str, Any] | None, reference: Mapping[str, Any],
                 against: str = "the global model") -> None:
    """Raise :class:`UpdateRejected` unless ``update`` has exactly the keys of ``reference``, the same shapes,
    and only finite numeric values. Works for full weights and weight differences alike.

    ``against`` names the reference in the messages. Parameters are checked in the reference's order, so the
    message names the first one that does not fit."""
    if not update:
        raise UpdateRejected(f"no parameters ({against} has {len(reference)})")
    missing = sorted(set(reference) - set(update))
    extra = sorted(set(update) - set(reference))
    if missing or extra:
        found = [f"{len(names)} {kind} {_quote(names)}" for kind, names in (("missing", missing), ("unexpected", extra))
                 if names]
        raise UpdateRejected(f"parameter names do not match {against}: {', '.join(found)}")
    for name, ref in reference.items():
        try:
            value = np.asarray(update[name])
        except (TypeError, ValueError, RuntimeError) as e:  # not convertible to an array (bfloat16, objects, ...)
            raise UpdateRejected(f"parameter {name!r} is not a numeric array ({type(e).__name__}: {e})") from None
        if value.dtype.kind not in "biufc":
            raise UpdateRejected(f"parameter {name!r} is not numeric (dtype {value.dtype})")
        expected = tuple(np.shape(ref))
        if value.shape != expected:
            raise UpdateRejected(f"parameter {name!r} has shape {value.shape}, {against} has {expected}")
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            raise UpdateRejected(f"parameter {name!r} holds NaN or infinite values")


def _quote(names: Sequence[str]) -> str:
    """``['a', 'b', 'c', ...]``: the first few names, with an ellipsis when there are more."""
    shown = ", ".join(repr(n) for n in names[:NAMES_SHOWN])
    return f"[{shown}{', ...' if len(names) > NAMES_SHOWN else ''}]"
