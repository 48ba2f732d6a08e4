"""FedAvg's part of a job: the sample-size aggregator; every other method composes with it or replaces it."""

from __future__ import annotations

from feddg.flare.method_spec import Component, MethodPart

PART = MethodPart(
    name="fedavg",
    aggregator=Component("feddg.flare.fedavg.aggregator.SampleSizeAggregator"),
)
