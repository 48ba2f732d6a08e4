"""GA's part of a job: the GA aggregator, the sites' generalization gap, and the ``ga`` section of feddg.yaml."""

from __future__ import annotations

from feddg.config import GAConfig
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.method_spec import Component, MethodPart

PART = MethodPart(
    aggregator=Component("feddg.flare.ga.aggregator.GeneralizationAdjustmentAggregator",
                         {"config_file": CONFIG_FILE}),
    executor_args={"send_generalization_gap": True},
    experiment={"ga": GAConfig().model_dump()},
)
