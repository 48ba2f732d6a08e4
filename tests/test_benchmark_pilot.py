"""The rounds pilot (benchmarks/pilot_rounds.py): the stopping rule on hand-made curves, the sweep's protocol equal
to what the committed pilot chose, and the script end to end on a tiny setting (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.pilot_rounds import chosen_rounds, envelope, main
from feddg.benchmark.sweep import PILOT_SECONDS_PER_ROUND, SWEEP_ROUNDS
from tests.conftest import REPOSITORY, TINY_HELD_OUT_CASES, tiny_sets


def test_the_envelope_is_the_best_so_far_of_the_trailing_mean():
    assert envelope(np.array([0.1, 0.3, 0.2, 0.4, 0.35]), window=1) == pytest.approx([0.1, 0.3, 0.3, 0.4, 0.4])
    # trailing means of 2: 0.1, 0.2, 0.25, 0.3, 0.375 -> already rising
    assert envelope(np.array([0.1, 0.3, 0.2, 0.4, 0.35]), window=2) == pytest.approx([0.1, 0.2, 0.25, 0.3, 0.375])
    # one lucky round lifts the 5-round mean by a fifth of its jump only
    assert envelope(np.array([0.5] * 6 + [0.6] + [0.5] * 3))[-1] == pytest.approx(0.52)


def test_the_chosen_rounds_are_the_first_whose_last_fifth_gains_less_than_the_threshold():
    # c[i] = 0.05 (i + 1) up to round 9 (0.5), flat after. Gain of R rounds = c[R-1] - c[ceil(0.8 R) - 1]:
    # R = 10: c[9] - c[7] = 0.5 - 0.4 = 0.1; R = 11: c[10] - c[8] = 0.05; R = 12: c[11] - c[9] = 0 < 0.01.
    curve = np.minimum(0.05 * np.arange(20), 0.45) + 0.05
    assert chosen_rounds(curve, 0.01, window=1) == 12
    # at 0.06: R = 5 gains 0.05, but R = 10 gains 0.1 again; from R = 11 on every length gains 0.05 or less
    assert chosen_rounds(curve, 0.06, window=1) == 11
    assert chosen_rounds(np.linspace(0, 1, 30), 0.01) is None  # still rising at the end  # still rising at the end
    # a dip after the plateau does not move the choice: the envelope keeps the best so far
    noisy = curve.copy()
    noisy[15] = 0.1
    assert chosen_rounds(noisy, 0.01, window=1) == chosen_rounds(curve, 0.01, window=1)
    # an early plateau (rounds 3-8 flat) that the curve leaves is not convergence
    stepped = np.concatenate([[0.1, 0.2, 0.3], np.full(6, 0.3), 0.3 + 0.05 * np.arange(1, 6), np.full(20, 0.55)])
    # the last rise ends at round 13 (0.55): R = 16 compares round 15 with round ceil(12.8) - 1 = 12 (0.50), a gain
    # of 0.05; R = 17 compares it with round 13: flat, and so is every longer length
    assert chosen_rounds(stepped, 0.01, window=1) == 17
    # smoothed over 5 rounds the level 0.55 is reached at round 17 (round 16: 0.54, a gain of exactly 0.01 left):
    # the last fifth must start at round 17, ceil(0.8 R) - 1 >= 17, R >= 22
    assert chosen_rounds(stepped, 0.01) == 22


@pytest.mark.parametrize("task", ["prostate", "fundus"])
def test_the_sweeps_protocol_is_what_the_committed_pilot_chose(task):
    pilot = json.loads((REPOSITORY / "benchmarks" / "results" / "pilot_rounds" / task / "pilot.json").read_text())
    assert SWEEP_ROUNDS[task] == pilot["chosen_rounds"]
    assert PILOT_SECONDS_PER_ROUND[task] == pytest.approx(pilot["seconds_per_round"], abs=0.05)
    assert chosen_rounds(np.array(pilot["curve"]), pilot["gain"]) == pilot["chosen_rounds"]


@pytest.mark.slow
def test_the_pilot_runs_end_to_end_on_a_tiny_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))
    code = main(["--task", "fundus", "--rounds", "5", "--held-out", "Domain1", "--gain", "1.0",
                 "--run-timeout", "600", "--out", str(tmp_path / "pilot"), *tiny_sets("fundus", TINY_HELD_OUT_CASES)])
    assert code == 0
    summary = json.loads((tmp_path / "pilot" / "fundus" / "pilot.json").read_text())
    assert len(summary["curve"]) == 5 and summary["chosen_rounds"] == 5  # any gain is below 1.0
    assert summary["seconds_per_round"] > 0 and summary["runs"][0]["run_id"] == "fundus_fedavg_Domain1_seed0"
    assert "Chosen: **5 rounds**" in (tmp_path / "pilot" / "fundus" / "pilot.md").read_text()
    assert (tmp_path / "pilot" / "fundus" / "pilot.png").stat().st_size > 1000
