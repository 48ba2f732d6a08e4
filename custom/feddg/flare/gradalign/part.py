"""Gradient alignment's part of a job: its aggregator, the sites' weight differences, the ``gradalign`` section.

The paper trains one local iteration per round (``train.local_steps: 1``); the CPU default keeps the whole local
epochs of the other jobs so that the comparison with FedAvg holds."""

from __future__ import annotations

from feddg.config import GradAlignConfig
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.method_spec import Component, MethodPart

PART = MethodPart(
    aggregator=Component("feddg.flare.gradalign.aggregator.GradientAlignmentAggregator",
                         {"config_file": CONFIG_FILE}),
    executor_args={"send_weight_diff": True},
    experiment={"gradalign": GradAlignConfig().model_dump()},
)
