"""The toy method's part of a job: its aggregator, nothing else."""

from __future__ import annotations

from feddg.flare.method_spec import Component, MethodPart

PART = MethodPart(aggregator=Component("tests.toy_method.aggregator.MedianAggregator"))
