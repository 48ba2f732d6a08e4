"""The envelope check every project filter runs before its contract's check, asserted once for all of them.

:class:`feddg.flare.payload_filter.PayloadFilter` calls :func:`feddg.flare.payloads.check_envelope` on every payload
it checks: nothing may ride next to the DXO, and no header may carry an array. Each filter's component test calls
:func:`assert_envelope_enforced` with its own valid payload, so a filter that stops running the check fails its test.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from nvflare.apis.filter import ContentBlockedException
from nvflare.apis.shareable import Shareable

SMUGGLED = np.random.default_rng(0).normal(size=(2, 1, 8, 8)).astype(np.float32)


def assert_envelope_enforced(run: Callable[[Shareable], Shareable], valid: Callable[[], Shareable]) -> None:
    """``run`` (the filter on one payload) blocks ``valid()`` with an array beside its DXO or in a header."""
    s = valid()
    s["smuggled"] = SMUGGLED
    with pytest.raises(ContentBlockedException, match="unexpected top-level keys"):
        run(s)
    s = valid()
    s.set_header("note", SMUGGLED)
    with pytest.raises(ContentBlockedException, match="header 'note' carries array data"):
        run(s)
