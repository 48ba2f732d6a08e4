"""The ``ga`` section of feddg.yaml: FedDG-GA (Zhang et al., CVPR 2023), generalization adjustment of the
aggregation weights."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from feddg.config import Settings


class GASettings(Settings):
    """FedDG-GA's step size and the split its generalization gaps are measured on. Only GA jobs read this
    section."""

    step_size: Annotated[float, Field(ge=0, lt=1)] = Field(0.05, description=(
        "d of Eq. (3); round r moves the weights by d_r = (1 - r / R) d. 0 keeps the uniform weights a_i = 1/M: "
        "the paper's Table 3 control (step 0)"))
    gap_split: Literal["train", "val"] = Field("train", description=(
        "the site split both losses of the generalization gap (Eq. 2's G_i) are measured on: 'train', the paper's "
        "empirical risk on the training set (two extra passes over it per round, without augmentation), or 'val', "
        "the validation split, the split the authors' released code uses (one extra pass; on the fundus benchmark "
        "its gaps from 4 images per site made GA fall behind uniform weighting, docs/methods.md)"))
