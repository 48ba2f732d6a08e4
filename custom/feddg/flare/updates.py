"""Checks on a site's model update before it may touch the global model (pure numpy)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


class UpdateRejected(ValueError):
    """A site's update cannot be aggregated; the message says why (never the values themselves)."""


def check_update(update: Mapping[str, Any] | None, reference: Mapping[str, Any]) -> None:
    """Raise :class:`UpdateRejected` unless ``update`` has exactly the keys of ``reference``, the same shapes,
    and only finite values. Works for full weights and weight differences alike."""
    if not update:
        raise UpdateRejected("the update carries no parameters")
    missing = sorted(set(reference) - set(update))
    extra = sorted(set(update) - set(reference))
    if missing or extra:
        raise UpdateRejected(
            f"parameter names do not match the global model (missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {extra[:5]}{'...' if len(extra) > 5 else ''})"
        )
    for name, ref in reference.items():
        value = np.asarray(update[name])
        if value.shape != np.shape(ref):
            raise UpdateRejected(f"parameter {name!r} has shape {value.shape}, the global model has {np.shape(ref)}")
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            raise UpdateRejected(f"parameter {name!r} holds NaN or infinite values")
