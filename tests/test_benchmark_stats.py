"""Seed-level statistics: the two-level bootstrap against hand-worked moments and a brute-force enumeration, the
sign-flip test's exact p-values, power, Holm's correction, and cells with too few seeds."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from feddg.benchmark.stats import (
    PValue,
    compare_seeds,
    holm,
    minimum_detectable_difference,
    seeds_needed,
    sign_flip_test,
    two_level_distribution,
)

# 2 sites x 3 seeds x 4 cases of per-case differences (method - baseline), chosen so the moments work by hand.
HAND = {
    "A": np.array([[0.1, 0.1, 0.1, 0.1],     # seed 0: mean 0.1, case variance 0
                   [0.0, 0.2, 0.0, 0.2],     # seed 1: mean 0.1, case variance 0.01 (population)
                   [0.4, 0.4, 0.4, 0.4]]),   # seed 2: mean 0.4
    "B": np.array([[0.0, 0.0, 0.0, 0.0],
                   [-0.1, -0.1, -0.1, -0.1],
                   [0.1, 0.1, 0.1, 0.1]]),
}
# D_A = (0.1 + 0.1 + 0.4) / 3 = 0.2, D_B = 0, D = 0.1.
# Bootstrap variance of one drawn seed's case mean = variance of the seed means + mean case variance / n:
#   A: ((-0.1)^2 + (-0.1)^2 + 0.2^2) / 3 + (0 + 0.01 + 0) / 3 / 4 = 0.02 + 0.000833 = 0.0208333; over 3 seeds: / 3
#   B: ((0)^2 + (-0.1)^2 + 0.1^2) / 3 = 0.0066667; / 3
# D* = (A* + B*) / 2: variance (0.0069444 + 0.0022222) / 4 = 0.0022917.
HAND_MEAN, HAND_VARIANCE = 0.1, (0.0208333 / 3 + 0.0066667 / 3) / 4


def _runs(differences: dict[str, np.ndarray], base: float = 0.5) -> dict:
    """The paired-runs mapping for per-case differences: baseline scores ``base``, method ``base + d``."""
    return {site: {k: (base + row, np.full_like(row, base)) for k, row in enumerate(d)}
            for site, d in differences.items()}


# -- the two-level bootstrap ---------------------------------------------------------------------------------------


def test_point_estimate_is_the_mean_over_sites_of_the_mean_paired_seed_difference():
    result = compare_seeds(_runs(HAND), n_resamples=2000)
    assert result.mean == pytest.approx(HAND_MEAN, abs=1e-12)
    assert result.seeds["A"] == pytest.approx({0: 0.1, 1: 0.1, 2: 0.4})
    assert result.seeds["B"] == pytest.approx({0: 0.0, 1: -0.1, 2: 0.1})
    assert result.n_seeds == 3 and result.has_interval
    # pooled SD of the seed differences: sqrt(mean(var_A, var_B)) with ddof 1: var_A = 0.03, var_B = 0.01
    assert result.sd == pytest.approx(np.sqrt(0.02), abs=1e-12)


def test_two_level_resamples_have_the_hand_worked_mean_and_variance():
    values = two_level_distribution(HAND, 200_000, np.random.default_rng(1))
    assert values.mean() == pytest.approx(HAND_MEAN, abs=0.001)
    assert values.var() == pytest.approx(HAND_VARIANCE, rel=0.02)


def test_two_level_resamples_match_a_brute_force_enumeration():
    diffs = {"A": np.array([[0.0, 1.0], [2.0, 4.0]])}  # 2 seeds x 2 cases
    # Every outcome: the two drawn seeds (2^2 ways), then each drawn seed's two cases (2^2 ways each): 64, equally
    # likely.
    exact = []
    for seeds in itertools.product(range(2), repeat=2):
        for cases in itertools.product(range(2), repeat=4):
            draws = [diffs["A"][seeds[0], cases[0]], diffs["A"][seeds[0], cases[1]],
                     diffs["A"][seeds[1], cases[2]], diffs["A"][seeds[1], cases[3]]]
            exact.append(np.mean(draws))
    exact = np.array(exact)
    sampled = two_level_distribution(diffs, 100_000, np.random.default_rng(2))
    for x in np.unique(exact):
        assert np.mean(sampled <= x) == pytest.approx(np.mean(exact <= x), abs=0.01)


def test_the_interval_is_reproducible_and_contains_the_estimate():
    first = compare_seeds(_runs(HAND), n_resamples=2000, seed=3)
    assert compare_seeds(_runs(HAND), n_resamples=2000, seed=3) == first
    assert first.low < first.mean < first.high


def test_a_cell_with_two_seeds_shows_its_seed_values_and_no_interval():
    result = compare_seeds(_runs({"A": HAND["A"][:2]}), n_resamples=500)
    assert result.low is None and result.high is None and result.p is None
    assert not result.resolved()
    assert result.format() == "+0.100 (2 seeds: +0.100, +0.100)"
    assert compare_seeds(_runs({"A": HAND["A"][:1]}), n_resamples=500).format() == "+0.100 (1 seed)"
    assert compare_seeds(_runs({"A": HAND["A"][:2], "B": HAND["B"]}), n_resamples=500).format() == \
        "+0.050 (2-3 seeds per site)"


def test_seeds_of_one_site_must_score_the_same_cases():
    runs = {"A": {0: ([0.5, 0.6], [0.5, 0.5]), 1: ([0.5], [0.5])}}
    with pytest.raises(ValueError, match="site 'A'.*different numbers of cases"):
        compare_seeds(runs)
    with pytest.raises(ValueError, match="site 'A', seed 0: the method scored 2 cases, the baseline 1"):
        compare_seeds({"A": {0: ([0.5, 0.6], [0.5])}})
    with pytest.raises(ValueError, match="site 'A', seed 0: method scores contain non-finite"):
        compare_seeds({"A": {0: ([np.nan], [0.5])}})
    with pytest.raises(ValueError, match="n_resamples"):
        compare_seeds(_runs(HAND), n_resamples=0)


# -- the sign-flip test --------------------------------------------------------------------------------------------


def test_sign_flip_exact_p_with_three_paired_seeds():
    # Three positive differences: only the identity and the all-flipped pattern reach |D|: 2 of 8.
    assert sign_flip_test({"A": {0: 0.1, 1: 0.2, 2: 0.3}}) == PValue(0.25, "exact")


def test_sign_flip_exact_p_with_five_paired_seeds():
    # Magnitudes 0.1, 0.2, 0.3, 0.4, 0.05 sum to 1.05; a pattern's sum is 1.05 - 2F with F the flipped magnitudes.
    # |1.05 - 2F| >= 0.95 iff F <= 0.05 (F = 0 or 0.05: 2 patterns) or F >= 1.0 (their complements: 2): 4 of 32.
    p = sign_flip_test({"A": {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: -0.05}})
    assert p.kind == "exact" and p.value == pytest.approx(4 / 32)
    # The smallest p five seeds can give is 2/32: one site with 5 seeds cannot be resolved at 0.05.
    assert compare_seeds(_runs({"A": np.full((5, 3), 0.2)}), n_resamples=500).p.value == pytest.approx(2 / 32)


def test_sign_flip_weights_each_site_once_whatever_its_seed_count():
    # Site A: 2 seeds of +1, site B: 4 seeds of -0.5; D = (1 + -0.5) / 2 = 0.25.  Flipping one of A's seeds changes D
    # by 0.5 and one of B's by 0.125: |D*| >= 0.25 is counted over all 64 patterns by brute force here.
    seeds = {"A": {0: 1.0, 1: 1.0}, "B": {0: -0.5, 1: -0.5, 2: -0.5, 3: -0.5}}
    weights = np.array([0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
    values = np.array([1.0, 1.0, -0.5, -0.5, -0.5, -0.5])
    count = sum(abs(np.dot(np.array(s) * values, weights)) >= 0.25 - 1e-12
                for s in itertools.product((1, -1), repeat=6))
    assert sign_flip_test(seeds) == PValue(count / 64, "exact")


def test_sign_flip_draws_patterns_beyond_the_exact_limit_and_reports_a_bound_when_none_reaches():
    few = sign_flip_test({"A": {k: 0.1 for k in range(5)}}, exact_up_to=2, n_resamples=20_000)
    assert few.kind == "monte-carlo" and few.value == pytest.approx(2 / 32, abs=0.01)
    many = sign_flip_test({"A": {k: 0.1 for k in range(40)}}, n_resamples=1000)
    assert many == PValue(1 / 1000, "bound", 1000)
    assert many.format() == "< 0.001"


# -- power ---------------------------------------------------------------------------------------------------------


def test_minimum_detectable_difference_is_the_paired_t_approximation():
    # One site, 5 seeds, SD 0.05: df 4, t_0.975 = 2.7764, t_0.8 = 0.9410 -> 3.7174 * 0.05 / sqrt(5) = 0.0831
    assert minimum_detectable_difference(0.05, {"A": 5}) == pytest.approx(0.0831, abs=1e-4)
    # Four sites of 5 seeds: SE = 0.05 * sqrt(4 / 5) / 4; df 16: (2.1199 + 0.8647) * SE = 0.0334
    assert minimum_detectable_difference(0.05, {s: 5 for s in "ABCD"}) == pytest.approx(0.0334, abs=1e-4)
    assert minimum_detectable_difference(0.05, {"A": 1}) is None
    needed = seeds_needed(0.05, 4)
    assert minimum_detectable_difference(0.05, {s: needed for s in "ABCD"}) <= 0.01
    assert minimum_detectable_difference(0.05, {s: needed - 1 for s in "ABCD"}) > 0.01


def test_one_site_with_five_seeds_reports_no_resolvable_difference():
    result = compare_seeds(_runs({"A": np.linspace(0.1, 0.3, 5)[:, None] * np.ones((5, 4))}), n_resamples=500)
    assert result.min_p == pytest.approx(2 / 32) and result.mde is None
    assert not result.resolved()


def test_a_large_consistent_difference_over_sites_is_resolved():
    rng = np.random.default_rng(0)
    diffs = {s: 0.1 + rng.normal(0, 0.01, (5, 6)) for s in "ABCD"}
    result = compare_seeds(_runs(diffs), n_resamples=2000)
    assert result.p.kind == "exact" and result.p.value == pytest.approx(2 / 2 ** 20)
    assert result.low > 0 and result.resolved()
    assert json.loads(json.dumps(result.to_dict()))["n_seeds"] == 5


# -- Holm ----------------------------------------------------------------------------------------------------------


def test_holm_hand_worked_example():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01 = 0.03, max(0.03, 2 * 0.03) = 0.06, max(0.06, 1 * 0.04) = 0.06
    adjusted = holm({"a": PValue(0.01, "exact"), "b": PValue(0.04, "exact"), "c": PValue(0.03, "exact")})
    assert {k: v.value for k, v in adjusted.items()} == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": PValue(0.6, "exact"), "b": PValue(0.7, "exact")})["a"].value == 1.0


def test_holm_keeps_a_bound_a_bound():
    adjusted = holm({"a": PValue(1e-4, "bound", 10_000), "b": PValue(0.2, "exact")})
    assert adjusted["a"].kind == "bound" and adjusted["a"].value == pytest.approx(2e-4)
    assert adjusted["a"].format() == "< 0.0002"
    with pytest.raises(ValueError, match="'a'"):
        holm({"a": 0.5})
