"""The ``ga`` section of feddg.yaml: FedDG-GA (Zhang et al., CVPR 2023), generalization adjustment of the
aggregation weights."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from feddg.config import Settings


class GASettings(Settings):
    """FedDG-GA's step size. Only GA jobs read this section."""

    step_size: Annotated[float, Field(ge=0, lt=1)] = Field(0.05, description=(
        "d of Eq. (3); round r moves the weights by d_r = (1 - r / R) d. 0 keeps the uniform weights a_i = 1/M: "
        "the paper's Table 3 control (step 0)"))
