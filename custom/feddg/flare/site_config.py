"""A site's own settings, which no job can change: ``<site workspace>/local/feddg_site.json``.

The hospital's operator writes this file next to NVFlare's ``resources.json`` / ``privacy.json``. Every key is
optional::

    {
      "amplitude_bank_images": 100,   // ELCFS: at most this many training images contribute amplitude windows
                                      // (a seeded random subset); the job's elcfs.bank_images applies too, the
                                      // smaller wins. Absent or null: the job decides.
      "share_local_model": false,     // MLA: let the server keep this site's last local model and ship it in the
                                      // MLA bundle. Absent: false.
      "num_threads": 4,               // CPU threads of this site's job process (torch and OpenMP). Absent or
                                      // null: the host's cores shared by the site processes that run on it
                                      // (feddg.compute: all of them in a real deployment, one site per host).
      "share_case_scores": true       // send each evaluated case's Dice/HD95/ASD (by an anonymous index, never
                                      // a case id) with the summaries, for paired statistics between methods.
                                      // Absent: true. false: summaries only.
    }

The file is validated with the same strict schema rules as ``feddg.yaml`` (:mod:`feddg.config`): unknown keys,
wrong types (``"share_local_model": "yes"``) and out-of-range values are errors naming the file, the key and the
value, so that a typo does not silently fall back to a default.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

from nvflare.apis.fl_context import FLContext
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from feddg.config import describe_validation_error

SITE_CONFIG_FILE = "feddg_site.json"


class SiteConfigError(ValueError):
    """The site configuration file cannot be used; the message names the file and the key."""


class SiteConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    amplitude_bank_images: Annotated[int, Field(ge=0)] | None = None
    share_local_model: bool = False
    num_threads: Annotated[int, Field(ge=1)] | None = None
    share_case_scores: bool = True


def read_site_config(path: str) -> SiteConfig:
    if not os.path.exists(path):
        return SiteConfig()
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SiteConfigError(f"{path}: cannot read the site configuration: {e}") from e
    if not isinstance(raw, dict):
        raise SiteConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    try:
        return SiteConfig.model_validate(raw)
    except ValidationError as e:
        raise SiteConfigError(f"{path}: {describe_validation_error(e, SiteConfig)}") from None


def load_site_config(fl_ctx: FLContext) -> SiteConfig:
    """The running site's configuration (defaults when the file does not exist)."""
    local = fl_ctx.get_engine().get_workspace().get_site_config_dir()
    return read_site_config(os.path.join(local, SITE_CONFIG_FILE))
