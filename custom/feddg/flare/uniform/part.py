"""The uniform control's part of a job: the equal-weight aggregator, nothing else (the sites train as for FedAvg)."""

from __future__ import annotations

from feddg.flare.method_spec import Component, MethodPart

PART = MethodPart(
    name="uniform",
    aggregator=Component("feddg.flare.uniform.aggregator.UniformAggregator"),
)
