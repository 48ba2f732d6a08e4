"""The ``gradalign`` section of feddg.yaml: gradient alignment of the sites' weight differences (Algorithm 1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from feddg.config import Settings


class GradAlignSettings(Settings):
    """Only gradient-alignment jobs read this section; the random order in which each site visits the others is
    drawn from ``train.seed`` and the round."""

    lam: Annotated[float, Field(gt=0, le=0.5)] = Field(0.1, description="lambda of Eq. (5)")
    average_norm_stats: bool = Field(True, description=(
        "average normalization running statistics plainly instead of aligning them"))
