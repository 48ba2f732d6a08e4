"""GA's part of a job: the GA aggregator, the sites' generalization gap, and the ``ga`` section of feddg.yaml."""

from __future__ import annotations

from feddg.config import FedDGConfig, GAConfig
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.method_spec import Component, MethodPart


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
    aggregator=Component("feddg.flare.ga.aggregator.GeneralizationAdjustmentAggregator",
                         {"config_file": CONFIG_FILE}),
    executor_args={"send_generalization_gap": True},
    experiment={"ga": GAConfig().model_dump()},
    inactive_when=inactive_when,
)
