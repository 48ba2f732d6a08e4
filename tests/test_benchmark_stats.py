"""Paired and site-stratified bootstrap differences against FedAvg, Holm's correction: hand-worked numbers, the same
intervals as a direct scipy call, degenerate data, the BCa -> percentile fallback, bad inputs named."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
from scipy import stats

import feddg.benchmark.stats as bstats
from feddg.benchmark.stats import Difference, holm, paired_difference, stratified_difference

N = 2000  # resamples: enough for stable assertions, cheap on a shared machine

METHOD = [0.80, 0.75, 0.90, 0.62, 0.71, 0.85]
BASELINE = [0.78, 0.70, 0.91, 0.55, 0.69, 0.80]
# differences: +0.02, +0.05, -0.01, +0.07, +0.02, +0.05 -> sum 0.20, mean 0.20 / 6
HAND_MEAN = 0.20 / 6

RNG_KEYWORD = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def _direct(data, statistic, *, paired, method, seed=0, n_resamples=N):
    return stats.bootstrap(data, statistic, n_resamples=n_resamples, vectorized=True, paired=paired, axis=-1,
                           confidence_level=0.95, method=method, **{RNG_KEYWORD: np.random.default_rng(seed)})


def _hand_p(distribution, n_resamples=N):
    below, above = np.mean(distribution <= 0), np.mean(distribution >= 0)
    return max(min(1.0, 2 * min(below, above)), 1 / (n_resamples + 1))


def _effect(shift, noise, n=20, seed=3):
    rng = np.random.default_rng(seed)
    baseline = rng.uniform(0.6, 0.85, n)
    eps = rng.normal(0.0, noise, n)
    eps -= eps.mean()  # the observed mean difference is exactly `shift`
    return baseline + shift + eps, baseline


# -- paired_difference -------------------------------------------------------------------------------------------


def test_paired_mean_is_the_hand_computed_mean_difference_and_the_interval_is_scipys():
    result = paired_difference(METHOD, BASELINE, n_resamples=N, seed=7)
    assert result.mean == pytest.approx(HAND_MEAN, abs=1e-12)
    assert result.n_cases == 6 and result.confidence == 0.95
    assert result.method == "BCa"

    direct = _direct((np.array(METHOD), np.array(BASELINE)), lambda a, b, axis: a.mean(axis) - b.mean(axis),
                     paired=True, method="BCa", seed=7)
    assert result.low == pytest.approx(direct.confidence_interval.low, abs=1e-12)
    assert result.high == pytest.approx(direct.confidence_interval.high, abs=1e-12)
    assert result.p_value == pytest.approx(_hand_p(direct.bootstrap_distribution), abs=1e-12)
    assert result.low < result.mean < result.high


def test_the_seed_makes_the_result_reproducible_and_another_seed_changes_it():
    first = paired_difference(METHOD, BASELINE, n_resamples=N, seed=1)
    assert paired_difference(METHOD, BASELINE, n_resamples=N, seed=1) == first
    assert paired_difference(METHOD, BASELINE, n_resamples=N, seed=2) != first


def test_a_clear_positive_effect_excludes_zero_with_a_small_p_value():
    method, baseline = _effect(0.1, 0.02)
    result = paired_difference(method, baseline, n_resamples=N)
    assert result.mean == pytest.approx(0.1, abs=1e-12)
    assert 0 < result.low < 0.1 < result.high
    assert result.excludes_zero
    assert result.p_value == pytest.approx(1 / (N + 1))  # no resample reaches zero: the floor
    assert result.format().endswith("*")


def test_a_clear_negative_effect_excludes_zero_too():
    baseline, method = _effect(0.1, 0.02)
    result = paired_difference(method, baseline, n_resamples=N)
    assert result.high < 0 and result.excludes_zero and result.p_value < 0.01


def test_pure_noise_around_zero_does_not_exclude_zero():
    method, baseline = _effect(0.0, 0.05)
    result = paired_difference(method, baseline, n_resamples=N)
    assert result.low < 0 < result.high
    assert not result.excludes_zero
    assert result.p_value > 0.5
    assert not result.format().endswith("*")


def test_identical_differences_give_a_degenerate_interval_without_scipy(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("scipy.stats.bootstrap must not be called on degenerate data")

    monkeypatch.setattr(bstats.stats, "bootstrap", fail)
    shifted = paired_difference([0.5, 0.6, 0.7, 0.8], [0.45, 0.55, 0.65, 0.75], n_resamples=N)
    assert shifted.method == "degenerate"
    assert shifted.mean == pytest.approx(0.05, abs=1e-12)
    assert shifted.low == shifted.high == shifted.mean
    assert shifted.p_value == pytest.approx(1 / (N + 1))
    assert shifted.excludes_zero

    same = paired_difference([0.5, 0.6, 0.7], [0.5, 0.6, 0.7], n_resamples=N)
    assert (same.mean, same.low, same.high, same.p_value, same.method) == (0.0, 0.0, 0.0, 1.0, "degenerate")
    assert not same.excludes_zero


def test_bca_failure_falls_back_to_the_percentile_interval(monkeypatch):
    real = stats.bootstrap

    def no_bca(*args, **kwargs):
        if kwargs.get("method") == "BCa":
            raise ValueError("BCa unavailable")
        return real(*args, **kwargs)

    monkeypatch.setattr(bstats.stats, "bootstrap", no_bca)
    result = paired_difference(METHOD, BASELINE, n_resamples=N, seed=4)
    direct = _direct((np.array(METHOD), np.array(BASELINE)), lambda a, b, axis: a.mean(axis) - b.mean(axis),
                     paired=True, method="percentile", seed=4)
    assert result.method == "percentile"
    assert result.low == pytest.approx(direct.confidence_interval.low, abs=1e-12)
    assert result.high == pytest.approx(direct.confidence_interval.high, abs=1e-12)


def test_a_nan_bca_interval_falls_back_to_percentile(monkeypatch):
    real = stats.bootstrap

    def nan_bca(*args, **kwargs):
        result = real(*args, **kwargs)
        if kwargs.get("method") == "BCa":
            result.confidence_interval = type(result.confidence_interval)(np.nan, np.nan)
        return result

    monkeypatch.setattr(bstats.stats, "bootstrap", nan_bca)
    result = stratified_difference({"A": (METHOD, BASELINE)}, n_resamples=N)
    assert result.method == "percentile"
    assert np.isfinite(result.low) and np.isfinite(result.high) and result.low < result.high


# -- stratified_difference ---------------------------------------------------------------------------------------


def test_stratified_mean_is_the_plain_mean_of_the_site_means():
    per_site = {
        "A": ([0.9, 0.8, 0.7], [0.8, 0.6, 0.4]),  # differences 0.1, 0.2, 0.3 -> mean 0.2
        "B": ([0.5, 0.4], [0.5, 0.5]),  # differences 0.0, -0.1 -> mean -0.05
    }
    result = stratified_difference(per_site, n_resamples=N)
    assert result.mean == pytest.approx((0.2 + -0.05) / 2, abs=1e-12)  # 0.075, not the pooled 0.5 / 5 = 0.1
    assert result.n_cases == 5
    assert result.low <= result.mean <= result.high


def test_stratified_interval_is_scipys_with_one_sample_per_site():
    per_site = {"A": (METHOD, BASELINE), "B": ([0.9, 0.8, 0.7, 0.6], [0.8, 0.6, 0.4, 0.65])}
    result = stratified_difference(per_site, n_resamples=N, seed=5)
    samples = tuple(np.array(m) - np.array(b) for m, b in per_site.values())
    direct = _direct(samples, lambda x, y, axis: (x.mean(axis) + y.mean(axis)) / 2, paired=False, method=result.method,
                     seed=5)
    assert result.low == pytest.approx(direct.confidence_interval.low, abs=1e-12)
    assert result.high == pytest.approx(direct.confidence_interval.high, abs=1e-12)
    assert result.p_value == pytest.approx(_hand_p(direct.bootstrap_distribution), abs=1e-12)


def test_stratified_with_one_site_matches_paired_on_that_site():
    method, baseline = _effect(0.03, 0.05, n=15, seed=11)
    paired = paired_difference(method, baseline, n_resamples=N, seed=0)
    stratified = stratified_difference({"only": (method, baseline)}, n_resamples=N, seed=0)
    assert stratified.mean == paired.mean
    assert stratified.n_cases == paired.n_cases == 15
    assert stratified.low == pytest.approx(paired.low, abs=5e-3)
    assert stratified.high == pytest.approx(paired.high, abs=5e-3)


def test_stratified_sites_with_constant_differences_are_degenerate():
    per_site = {"A": ([0.6, 0.7], [0.5, 0.6]), "B": ([0.4, 0.4, 0.4], [0.4, 0.4, 0.4])}
    result = stratified_difference(per_site, n_resamples=N)
    assert result.method == "degenerate"
    assert result.mean == pytest.approx(0.05, abs=1e-12) and result.low == result.high == result.mean


# -- holm --------------------------------------------------------------------------------------------------------


def test_holm_hand_worked_example():
    # sorted: a 0.01 * 3 = 0.03; c 0.03 * 2 = 0.06; b 0.04 * 1 = 0.04 -> raised to 0.06 (step-down monotone)
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert list(adjusted) == ["a", "b", "c"]
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})


def test_holm_is_monotone_and_capped_at_one():
    raw = {"x": 0.02, "y": 0.01, "z": 0.03, "w": 0.5}
    adjusted = holm(raw)
    # y 0.01*4=0.04; x 0.02*3=0.06; z 0.03*2=0.06; w 0.5*1=0.5
    assert adjusted == pytest.approx({"y": 0.04, "x": 0.06, "z": 0.06, "w": 0.5})
    order = sorted(raw, key=raw.get)
    assert all(adjusted[p] <= adjusted[q] for p, q in zip(order, order[1:]))
    assert all(adjusted[k] >= raw[k] for k in raw)
    assert holm({"a": 0.4, "b": 0.6}) == {"a": 0.8, "b": 0.8}
    assert holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    assert holm({}) == {}


def test_holm_rejects_values_that_are_not_p_values():
    with pytest.raises(ValueError, match="'a'.*in \\[0, 1\\]"):
        holm({"a": 1.5})
    with pytest.raises(ValueError, match="'b'"):
        holm({"a": 0.1, "b": float("nan")})


# -- Difference --------------------------------------------------------------------------------------------------


def test_difference_format_and_json():
    d = Difference(mean=0.0523, low=0.0114, high=0.0931, p_value=0.002, n_cases=40, confidence=0.95, method="BCa")
    assert d.format() == "+0.052 [+0.011, +0.093]*"
    assert d.format(digits=2) == "+0.05 [+0.01, +0.09]*"
    assert Difference(-0.01, -0.03, 0.01, 0.4, 10, 0.95, "percentile").format() == "-0.010 [-0.030, +0.010]"
    assert Difference(-0.05, -0.08, -0.02, 0.01, 10, 0.95, "BCa").excludes_zero
    result = paired_difference(np.float32(METHOD), BASELINE, n_resamples=N)
    as_dict = result.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert {type(v) for v in as_dict.values()} <= {float, int, str}
    assert as_dict["method"] == result.method and as_dict["n_cases"] == 6


# -- bad inputs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, baseline, message", [
    ([0.1, 0.2, 0.3], [0.1, 0.2], "different lengths \\(3 vs 2\\)"),
    ([0.1, float("nan"), 0.3], [0.1, 0.2, 0.3], "method scores contain non-finite .* \\[1\\]"),
    ([0.1, 0.2], [0.1, float("inf")], "baseline scores contain non-finite"),
    ([0.1], [0.2], "at least 2 cases.*got 1"),
    ([], [], "at least 2 cases.*got 0"),
    ([[0.1, 0.2]], [[0.1, 0.2]], "one-dimensional"),
    (["a", "b"], [0.1, 0.2], "must be numbers"),
])
def test_paired_bad_inputs_are_named(method, baseline, message):
    with pytest.raises(ValueError, match=message):
        paired_difference(method, baseline, n_resamples=N)


def test_stratified_bad_inputs_are_named():
    with pytest.raises(ValueError, match="per_site is empty"):
        stratified_difference({}, n_resamples=N)
    with pytest.raises(ValueError, match="site 'B'.*at least 2 cases.*got 1"):
        stratified_difference({"A": ([0.1, 0.2], [0.1, 0.3]), "B": ([0.1], [0.2])}, n_resamples=N)
    with pytest.raises(ValueError, match="site 'A'.*different lengths"):
        stratified_difference({"A": ([0.1, 0.2], [0.1, 0.3, 0.4])}, n_resamples=N)
    with pytest.raises(ValueError, match="site 'A': baseline scores contain non-finite"):
        stratified_difference({"A": ([0.1, 0.2], [0.1, float("nan")])}, n_resamples=N)
    with pytest.raises(ValueError, match="site 'A': expected a pair"):
        stratified_difference({"A": ([0.1, 0.2],)}, n_resamples=N)


@pytest.mark.parametrize("kwargs, message", [
    ({"confidence": 1.0}, "confidence"), ({"confidence": 0}, "confidence"),
    ({"confidence": float("nan")}, "confidence"),
    ({"n_resamples": 0}, "n_resamples"), ({"n_resamples": 10.5}, "n_resamples"),
])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        paired_difference(METHOD, BASELINE, **kwargs)
