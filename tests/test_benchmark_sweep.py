"""The sweep's plan without running it: what a seed changes, one protocol per folder, runs validated up front."""

from __future__ import annotations

import pytest

from feddg.benchmark.sweep import Protocol, Run, plan, prepare_folder, run_experiment, seed_overrides
from feddg.config import ConfigError


def test_a_seed_sets_the_training_seed_and_the_methods_seeds_never_the_splits_or_the_data():
    exp = run_experiment(Protocol("prostate"), Run("prostate", "mlabin", "BMC", 7))
    assert exp["train"]["seed"] == 7 and exp["mla"]["encoder_seed"] == 7 and exp["mla"]["attention_seed"] == 7
    assert exp["data"]["split_seed"] == 0 and exp["data"]["synthetic"]["seed"] == 0
    assert exp["data"]["unseen_site"] == "BMC"
    assert seed_overrides({"data": {"split_seed": 0}, "ga": {"step_size": 0.05}}, 3) == {"train": {"seed": 3}}


def test_a_folder_keeps_one_protocol(tmp_path):
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}))
    prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 2}}))  # the same: resumed
    with pytest.raises(ConfigError, match='made with overrides = {"train": {"rounds": 2}}'):
        prepare_folder(tmp_path, Protocol("fundus", {"train": {"rounds": 3}}))
    with pytest.raises(ConfigError, match="made with task"):
        prepare_folder(tmp_path, Protocol("prostate", {"train": {"rounds": 2}}))


def test_every_run_is_validated_before_any_runs():
    runs = plan(Protocol("fundus"), ["fedavg", "elcfs_ga", "fedprox"], ["Domain1", "Domain4"], [0, 1])
    assert len(runs) == 12 and runs[0].run_id == "fundus_fedavg_Domain1_seed0"
    with pytest.raises(ValueError, match="unknown method"):
        plan(Protocol("fundus"), ["fedavg", "fedsr"], ["Domain1"], [0])
    with pytest.raises(ConfigError, match="data.unseen_site"):
        plan(Protocol("fundus"), ["fedavg"], ["Domain9"], [0])
