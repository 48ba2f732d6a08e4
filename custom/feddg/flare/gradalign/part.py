"""Gradient alignment's part of a job: its aggregator, the sites' weight differences, the ``gradalign`` section.

The paper trains one local iteration per round (``train.local_steps: 1``); the CPU default keeps the whole local
epochs of the other jobs so that the comparison with FedAvg holds."""

from __future__ import annotations

from feddg.config import FedDGConfig
from feddg.experiment import Section
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.gradalign.settings import GradAlignSettings
from feddg.flare.method_spec import Component, MethodPart


def inactive_when(cfg: FedDGConfig) -> str | None:
    """Why gradient alignment would give the plain mean of the updates in every round, or None: with fewer than
    three training sites (two sites are pulled towards each other by the same amount, so the mean of the corrected
    updates is the plain mean; see :mod:`feddg.methods.gradalign`)."""
    sites = len(cfg.data.train_sites)
    if sites < 3:
        return (f"gradient alignment changes the plain mean only with three or more training sites; this experiment "
                f"has {sites}")
    return None


PART = MethodPart(
    name="gradalign",
    aggregator=Component("feddg.flare.gradalign.aggregator.GradientAlignmentAggregator",
                         {"config_file": CONFIG_FILE}),
    executor_args={"send_weight_diff": True},
    section=Section("gradalign", GradAlignSettings, "gradient alignment of the sites' weight differences "
                                                    "(Algorithm 1)"),
    inactive_when=inactive_when,
)
