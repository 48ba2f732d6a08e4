"""Eq. (3) of FedDG-GA against hand-worked values."""

import math

import pytest

from feddg.methods.ga import adjust_weights, aggregation_weights, step_size

THIRD = 1 / 3


def test_hand_worked_example_from_the_issue():
    # mu = 0.30; G - mu = (0, -0.15, 0.15); max = 0.15; a' = 1/3 + 0.05 * (0, -1, 1) = (0.3333, 0.2833, 0.3833);
    # it already sums to 1, so renormalizing changes nothing.
    a = adjust_weights({"A": THIRD, "B": THIRD, "C": THIRD}, {"A": 0.30, "B": 0.15, "C": 0.45}, step_size(0, 10))
    assert a == pytest.approx({"A": 0.33333, "B": 0.28333, "C": 0.38333}, abs=1e-5)
    assert sum(a.values()) == pytest.approx(1.0)


def test_linear_decay():
    assert step_size(0, 10, 0.05) == pytest.approx(0.05)
    assert step_size(5, 10, 0.05) == pytest.approx(0.025)  # r = R/2: half the first step
    assert step_size(1, 4, 0.05) == pytest.approx(0.0375)  # the first adjustment happens at r = 1
    assert step_size(10, 10, 0.05) == 0.0


def test_clipping_and_renormalization():
    # a = (0.02, 0.49, 0.49), G = (0, 1, 2): mu = 1, max = 1, step 0.05 -> a' = (-0.03, 0.49, 0.54)
    # clip -> (0, 0.49, 0.54), sum 1.03 -> (0, 0.4757, 0.5243)
    a = adjust_weights({"A": 0.02, "B": 0.49, "C": 0.49}, {"A": 0.0, "B": 1.0, "C": 2.0}, 0.05)
    assert a == pytest.approx({"A": 0.0, "B": 0.49 / 1.03, "C": 0.54 / 1.03})


def test_equal_gaps_or_no_gaps_keep_the_weights():
    w = {"A": 0.2, "B": 0.3, "C": 0.5}
    assert adjust_weights(w, {"A": 0.1, "B": 0.1, "C": 0.1}, 0.05) == w
    assert adjust_weights(w, {}, 0.05) == w


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf, "0.3", True])
def test_invalid_gap_is_neither_adjusted_nor_in_the_mean(bad):
    # Valid gaps B = 0.1, C = 0.3: mu = 0.2, max = 0.1 -> B - 0.05, C + 0.05; A keeps 1/3.
    a = adjust_weights({"A": THIRD, "B": THIRD, "C": THIRD}, {"A": bad, "B": 0.1, "C": 0.3}, 0.05)
    assert a == pytest.approx({"A": THIRD, "B": THIRD - 0.05, "C": THIRD + 0.05})


def test_absent_site_keeps_its_weight_and_present_sites_keep_their_mass():
    stored = {"A": 0.25, "B": 0.25, "C": 0.5}
    present = {"A": stored["A"], "B": stored["B"]}  # C missed the round
    new = adjust_weights(present, {"A": 0.0, "B": 1.0}, 0.05)
    assert sum(new.values()) == pytest.approx(0.5)  # C's 0.5 stays untouched
    assert new == pytest.approx({"A": 0.2, "B": 0.3})
    assert aggregation_weights({**stored, **new}, ["A", "B"]) == pytest.approx({"A": 0.4, "B": 0.6})


def test_gap_for_unknown_site_is_an_error():
    with pytest.raises(ValueError, match="Z"):
        adjust_weights({"A": 1.0}, {"Z": 0.1}, 0.05)


def test_step_zero_keeps_the_uniform_weights_of_table_3():
    # The paper's Table 3 control "step 0": the weights stay 1/M whatever the gaps.
    uniform = {"A": THIRD, "B": THIRD, "C": THIRD}
    for r in range(5):
        a = adjust_weights(uniform, {"A": 0.0, "B": 0.4, "C": 0.9}, step_size(r, 5, d=0.0))
        assert a == pytest.approx(uniform)
