"""A method says when it cannot act in an experiment: GA with one round or one training site, gradient alignment
with fewer than three training sites; every other method always acts."""

from __future__ import annotations

import pytest

from feddg.config import FedDGConfig
from feddg.experiment import experiment_from_dict, merge
from feddg.flare.registry import method, methods
from tests.conftest import tiny_experiment

ALWAYS_ACTING = ["fedavg", "uniform", "fedprox", "elcfs", "mlabin"]


def _experiment(name: str, train_sites: int, rounds: int, **sections) -> FedDGConfig:
    exp = merge(tiny_experiment("prostate", rounds=rounds), method(name).experiment("prostate"))
    exp["data"].update(sites=[*"ABCDE"[:train_sites], "U"], unseen_site="U")
    return experiment_from_dict(merge(exp, sections))


def test_every_registered_method_is_covered():
    assert set(methods()) == {*ALWAYS_ACTING, "ga", "elcfs_ga", "gradalign"}


@pytest.mark.parametrize("name", ["ga", "elcfs_ga"])
def test_ga_with_fewer_than_two_rounds_never_uses_a_gap(name):
    reason = method(name).inactive_reason(_experiment(name, 3, rounds=1))
    assert reason and "train.rounds = 1" in reason and "\n" not in reason
    assert method(name).inactive_reason(_experiment(name, 3, rounds=2)) is None


def test_ga_with_one_training_site_has_nothing_to_reweigh():
    reason = method("ga").inactive_reason(_experiment("ga", 1, rounds=4))
    assert reason and "has 1" in reason
    assert method("ga").inactive_reason(_experiment("ga", 2, rounds=4)) is None


def test_ga_with_step_size_zero_is_the_step_0_control_not_inactive():
    assert method("ga").inactive_reason(_experiment("ga", 3, rounds=4, ga={"step_size": 0.0})) is None


@pytest.mark.parametrize("train_sites, inactive", [(1, True), (2, True), (3, False), (5, False)])
def test_gradient_alignment_needs_three_training_sites(train_sites, inactive):
    reason = method("gradalign").inactive_reason(_experiment("gradalign", train_sites, rounds=4))
    assert (reason is not None) == inactive
    if inactive:
        assert f"has {train_sites}" in reason and "three" in reason


@pytest.mark.parametrize("name", ALWAYS_ACTING)
def test_the_other_methods_always_act(name):
    assert method(name).inactive_reason(_experiment(name, 1, rounds=1)) is None
