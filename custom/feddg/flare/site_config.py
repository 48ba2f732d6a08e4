"""A site's own settings, which no job can change: ``<site workspace>/local/feddg_site.json``.

The hospital's operator writes this file next to NVFlare's ``resources.json`` / ``privacy.json``. Every key is
optional::

    {
      "amplitude_bank_images": 100,   // ELCFS: at most this many training images contribute amplitude windows
                                      // (a seeded random subset); the job's elcfs.bank_images applies too, the
                                      // smaller wins. Absent or null: the job decides.
      "share_local_model": false      // MLA: let the server keep this site's last local model and ship it in the
                                      // MLA bundle. Absent: false.
    }

Unknown keys are errors, so that a typo does not silently fall back to a default.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields

from nvflare.apis.fl_context import FLContext

SITE_CONFIG_FILE = "feddg_site.json"


class SiteConfigError(ValueError):
    """The site configuration file cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class SiteConfig:
    amplitude_bank_images: int | None = None
    share_local_model: bool = False


def read_site_config(path: str) -> SiteConfig:
    if not os.path.exists(path):
        return SiteConfig()
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SiteConfigError(f"{path}: cannot read the site configuration: {e}") from e
    if not isinstance(raw, dict):
        raise SiteConfigError(f"{path}: expected a JSON object")
    known = {f.name for f in fields(SiteConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SiteConfigError(f"{path}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    cap = raw.get("amplitude_bank_images")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
        raise SiteConfigError(f"{path}: amplitude_bank_images must be a non-negative integer or null, got {cap!r}")
    share = raw.get("share_local_model", False)
    if not isinstance(share, bool):
        raise SiteConfigError(f"{path}: share_local_model must be true or false, got {share!r}")
    return SiteConfig(amplitude_bank_images=cap, share_local_model=share)


def load_site_config(fl_ctx: FLContext) -> SiteConfig:
    """The running site's configuration (defaults when the file does not exist)."""
    local = fl_ctx.get_engine().get_workspace().get_site_config_dir()
    return read_site_config(os.path.join(local, SITE_CONFIG_FILE))
