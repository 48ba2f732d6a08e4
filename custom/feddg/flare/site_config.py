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
      "share_case_scores": true,      // send each evaluated case's Dice/HD95/ASD (by an anonymous index, never
                                      // a case id) with the summaries, for paired statistics between methods.
                                      // Absent: true. false: summaries only.
      "data_root": "/data/prostate"   // this hospital's data: the folder holding its site folder, in the job's
                                      // data.layout. A job on real data (data.root not null) reads them from
                                      // here, whatever path its data.root names; a job whose data.root is
                                      // AT_EACH_SITE needs it. Synthetic jobs (data.root null) ignore it.
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

from feddg.config import DataConfig, describe_validation_error

SITE_CONFIG_FILE = "feddg_site.json"
# The data.root of a job submitted to a deployment (``feddg benchmark --executor flare``): it names no folder, so no
# hospital's path travels to the others; each site reads its own ``data_root``.
AT_EACH_SITE = "<data_root in each site's local/feddg_site.json>"


class SiteConfigError(ValueError):
    """The site configuration file cannot be used; the message names the file and the key."""


class SiteConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    amplitude_bank_images: Annotated[int, Field(ge=0)] | None = None
    share_local_model: bool = False
    num_threads: Annotated[int, Field(ge=1)] | None = None
    share_case_scores: bool = True
    data_root: Annotated[str, Field(min_length=1)] | None = None


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


def site_data(data: DataConfig, site: SiteConfig, where: str) -> DataConfig:
    """The job's data settings as this site reads them: on real data (``data.root`` not null) the root is the site's
    own ``data_root`` when it sets one; synthetic data are unchanged. SiteConfigError naming ``where`` (the site's
    ``feddg_site.json``) when the job asks for each site's own data (:data:`AT_EACH_SITE`) and the site names none."""
    if data.root is None:
        return data
    if site.data_root is not None:
        return data.model_copy(update={"root": site.data_root})
    if data.root == AT_EACH_SITE:
        raise SiteConfigError(f"{where}: the job reads each hospital's own data, but this site sets no data_root "
                              f"(the folder holding its site folder, in the job's data.layout {data.layout!r})")
    return data


def load_site_config(fl_ctx: FLContext) -> SiteConfig:
    """The running site's configuration (defaults when the file does not exist)."""
    return read_site_config(site_config_path(fl_ctx))


def site_config_path(fl_ctx: FLContext) -> str:
    """``<site workspace>/local/feddg_site.json`` of the running site."""
    return os.path.join(fl_ctx.get_engine().get_workspace().get_site_config_dir(), SITE_CONFIG_FILE)
