"""The ``elcfs`` section of feddg.yaml: ELCFS (Liu et al., CVPR 2021), the amplitude exchange and the
boundary-oriented episodic learning, and the check that relates it to the experiment's sites."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from feddg.config import ConfigError, FedDGConfig, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, \
    Settings

Ratio = Annotated[float, Field(ge=0, le=1)]


class ELCFSSettings(Settings):
    """Only ELCFS jobs read this section."""

    alpha: Annotated[float, Field(ge=0, le=0.5)] = Field(0.01, description=(
        "window M = [-alpha H : alpha H, -alpha W : alpha W] of the centred amplitude spectrum"))
    min_half_width: NonNegativeInt = Field(1, description=(
        "floor of b = floor(alpha H): below 100 px alpha = 0.01 would keep the DC term alone"))
    bank_images: PositiveInt | None = Field(None, description=(
        "images a site contributes to the amplitude bank; null: all"))
    transforms_per_image: PositiveInt | None = Field(None, description=(
        "n_t meta-test images per image; null: K - 1, one per other site"))
    lam_range: Annotated[list[Ratio], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.0, 1.0], description="interpolation ratio lambda ~ U(low, high)")
    meta_step_size: NonNegativeFloat = Field(1e-3, description="beta, the inner step of Eq. (4)")
    boundary_weight: NonNegativeFloat = Field(0.5, description=(
        "gamma of Eq. (8): 0.5 prostate, 0.1 fundus in the paper (the fundus jobs use 0.02: the methods page)"))
    temperature: PositiveFloat = Field(0.05, description="tau of Eq. (6)")
    contrast_denominator: Literal["negatives", "all"] = Field("all", description=(
        "Eq. (6): negatives as printed, or all as in the cited SimCLR InfoNCE (measured: the printed form drowns "
        "the Dice loss; see feddg/methods/boundary.py)"))
    dilation_iterations: PositiveInt = Field(5, description="width of the background ring around the anatomy")
    second_order: bool = Field(False, description=(
        "back-propagate through the inner step (the authors' code is first order)"))
    exchange_timeout: PositiveInt = Field(600, description=(
        "seconds each step of the amplitude exchange waits for the sites"))


def check(cfg: FedDGConfig) -> None:
    """``transforms_per_image`` cannot exceed the other training sites; ``lam_range`` is [low, high]."""
    e, sites = cfg.elcfs, cfg.data.train_sites
    others = max(len(sites) - 1, 1)
    if e.transforms_per_image is not None and e.transforms_per_image > others:
        raise ConfigError(f"elcfs.transforms_per_image: must be between 1 and {others} (the other training sites) "
                          f"or null, got {e.transforms_per_image}")
    if e.lam_range[0] > e.lam_range[1]:
        raise ConfigError(f"elcfs.lam_range: must be [low, high] with low <= high, got {e.lam_range}")
