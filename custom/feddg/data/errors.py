"""The error and warning types of the data layer.

Every problem with the input data (a missing folder, an image without its mask, a corrupt file, a mask value
outside the layout's encoding, ...) is a :class:`DataError` whose message names the site, every file involved
and what is wrong, so that a site administrator can fix the data without reading code.

Input that is usable but suspicious (a mask that covers most of the image, an image far larger than the task needs)
is a :class:`DataWarning`, worded the same way: the data check lists it, loading a site logs it, neither stops.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass


def _format(site: str | None, paths: tuple[str, ...], reason: str) -> str:
    """``"site <site>: <path>, <path>: <reason>"``, leaving out what is not known."""
    parts = [] if site is None else [f"site {site}"]
    if paths:
        parts.append(", ".join(paths))
    parts.append(reason)
    return ": ".join(parts)


def os_reason(e: BaseException) -> str:
    """What went wrong, in words: the OS's own text for an OSError (``"Permission denied"``), else type and message."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"


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
        return _format(self.site, self.paths, self.reason)

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self):
        # Keep site/paths/reason when the error crosses a process boundary (NVFlare runs tasks in subprocesses);
        # the default exception pickling would rebuild it from the message alone.
        return (_rebuild, (self.reason, self.site, self.paths))


def _rebuild(reason: str, site: str | None, paths: tuple[str, ...]) -> DataError:
    return DataError(reason, site=site, paths=paths)


@dataclass(frozen=True)
class DataWarning:
    """Usable but suspicious input, named like a :class:`DataError`; ``str(w)`` reads the same way.

    ``paths`` may be given as any iterable of paths; it is kept as a tuple of strings.
    """

    reason: str
    _: KW_ONLY
    site: str | None = None
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))

    def __str__(self) -> str:
        return _format(self.site, self.paths, self.reason)
