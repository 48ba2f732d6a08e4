"""GA's part of a job: the GA aggregator, the sites' generalization gap (a site hook), the weight history the
server writes, and the ``ga`` section of feddg.yaml."""

from __future__ import annotations

from feddg.config import FedDGConfig
from feddg.experiment import Section
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.ga.settings import GASettings
from feddg.flare.method_spec import Component, MethodPart, ServerFile, SiteHook

AGGREGATOR = "feddg.flare.ga.aggregator.GeneralizationAdjustmentAggregator"
GENERALIZATION_GAP = "generalization_gap"  # the one scalar a GA site adds to its training result (Eq. 2)
HISTORY = ServerFile("ga_weights.json", writer=AGGREGATOR, resume_arg="resume_from", keep=True,
                     plot="feddg.flare.ga.plots:weight_history")


def inactive_when(cfg: FedDGConfig) -> str | None:
    """Why GA would not move the weights away from its uniform start, or None.

    Gaps are only used from round 1 on (round 0 carries none), with the step d^r = (1 - r/R) d, which is
    positive for every r < R when d > 0: so with ``train.rounds`` R < 2 no gap is ever used. With fewer than two
    training sites there is nothing to reweigh (the one site's weight is 1). ``ga.step_size: 0`` is not a reason:
    it is the paper's step-0 control, a legal GA run that keeps the uniform weights on purpose."""
    sites = len(cfg.data.train_sites)
    if cfg.train.rounds < 2:
        return f"GA uses the sites' generalization gaps from round 1 on; train.rounds = {cfg.train.rounds} has none"
    if sites < 2:
        return f"GA reweighs two or more training sites; this experiment has {sites}"
    return None


PART = MethodPart(
    name="ga",
    aggregator=Component(AGGREGATOR, {"config_file": CONFIG_FILE}),
    section=Section("ga", GASettings, "FedDG-GA (Zhang et al., CVPR 2023): generalization adjustment of the "
                                      "aggregation weights"),
    site_hooks=(SiteHook(Component("feddg.flare.ga.hook.GeneralizationGap", id="generalization_gap"),
                         sends=(GENERALIZATION_GAP,)),),
    server_files=(HISTORY,),
    inactive_when=inactive_when,
)
