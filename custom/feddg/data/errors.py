"""The one error type of the data layer.

Every problem with the input data (a missing folder, an image without its mask, a corrupt file, a mask value
outside the layout's encoding, ...) is a :class:`DataError` whose message names the site, every file involved
and what is wrong, so that a site administrator can fix the data without reading code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class DataError(ValueError):
    """A problem with a site's data.

    Attributes:
        site: the site (hospital / domain) the problem belongs to, or None when it is not site-specific.
        paths: every file or folder involved, as strings.
        reason: what is wrong, in words.

    ``str(err)`` reads ``"site I2CVB: /a/image/00_01.png, /a/mask/00_00.png: image has no mask ..."``.
    """

    def __init__(self, reason: str, *, site: str | None = None, paths: Iterable[str | os.PathLike] = ()) -> None:
        self.site = site
        self.paths = tuple(str(p) for p in paths)
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        parts = []
        if self.site is not None:
            parts.append(f"site {self.site}")
        if self.paths:
            parts.append(", ".join(self.paths))
        parts.append(self.reason)
        return ": ".join(parts)

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self):
        # Keep site/paths/reason when the error crosses a process boundary (NVFlare runs tasks in subprocesses);
        # the default exception pickling would rebuild it from the message alone.
        return (_rebuild, (self.reason, self.site, self.paths))


def _rebuild(reason: str, site: str | None, paths: tuple[str, ...]) -> DataError:
    return DataError(reason, site=site, paths=paths)
