"""The toy method's part of a job, and the method itself for the entry point ``tests.toy_method.part:METHOD``."""

from __future__ import annotations

from feddg.experiment import Section
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.method_spec import Component, Method, MethodPart, ServerFile, SiteHook
from tests.toy_method import settings

AGGREGATOR = "tests.toy_method.aggregator.MedianAggregator"
UPDATE_NORM = "median_update_norm"
HISTORY = ServerFile("median_history.json", writer=AGGREGATOR, resume_arg="resume_from", keep=True)

PART = MethodPart(
    name="median",
    aggregator=Component(AGGREGATOR, {"config_file": CONFIG_FILE}),
    section=Section("median", settings.MedianSettings, "the toy median method", checks=(settings.check,)),
    site_hooks=(SiteHook(Component("tests.toy_method.hook.UpdateNorm", id="update_norm"), sends=(UPDATE_NORM,)),),
    server_files=(HISTORY,),
)
METHOD = Method("median", (PART,))
