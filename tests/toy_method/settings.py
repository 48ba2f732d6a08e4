"""The toy method's ``median`` section of feddg.yaml."""

from __future__ import annotations

from pydantic import Field

from feddg.config import ConfigError, FedDGConfig, NonNegativeInt, Settings


class MedianSettings(Settings):
    """How many outlying updates the median ignores."""

    trim: NonNegativeInt = Field(0, description="sites whose update norm is largest left out of each round's median")


def check(cfg: FedDGConfig) -> None:
    """At least one training site must remain after trimming."""
    sites = len(cfg.data.train_sites)
    if cfg.median.trim >= sites:
        raise ConfigError(f"median.trim: must leave at least one of the {sites} training sites, got {cfg.median.trim}")
