"""Site log lines that travel to the server carry no file paths or patient identifiers.

In a POC or a deployment NVFlare streams each site's error log of a job to the server
(``JobLogStreamer``). The executors therefore log errors in two lines: :func:`public` for the ERROR line (what went
wrong, which site and task, without paths, file names or case ids) and the full detail at INFO, which stays in
the site's local log.

A :class:`~feddg.data.errors.DataError` keeps the names it carries in ``paths``; its public form is its reason and
site. Any other message is scrubbed: absolute and relative paths and names of image/volume files become
``<path>``, and the reason's file names (which embed case ids in the public layouts) go with them.
"""

from __future__ import annotations

import re

from feddg.data.errors import DataError

_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\w.\-~]*[/\\])+[\w.\-]+[/\\]?")
_FILE = re.compile(r"[\w.\-]+\.(?:nii\.gz|nii|png|jpe?g|tif{1,2}|bmp|dcm|npz|npy|mha|mhd|nrrd|h5|pt|json|ya?ml)\b",
                   re.IGNORECASE)


def scrub(text: str) -> str:
    """Replace paths and data-file names in ``text`` with ``<path>``."""
    return _FILE.sub("<path>", _PATH.sub("<path>", text))


def public(error: BaseException | str) -> str:
    """A message fit for the server: the error's kind and reason without paths or file names."""
    if isinstance(error, DataError):
        where = f"site {error.site}: " if error.site else ""
        files = f" ({len(error.paths)} file(s); see the site's local log)" if error.paths else ""
        return scrub(f"{where}{error.reason}{files}")
    if isinstance(error, BaseException):
        return scrub(f"{type(error).__name__}: {error}")
    return scrub(error)
