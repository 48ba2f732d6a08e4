"""Algorithm 1 / Eq. (5) of the gradient-alignment paper against hand-worked vectors and an independent loop."""

import numpy as np
import pytest

from feddg.methods.gradalign import align, align_updates, aligned_mean, random_orders

ASCENDING = [[1, 2], [0, 2], [0, 1]]


def test_hand_worked_three_sites():
    g = np.array([[1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]])
    hat = align_updates(g, 0.1, ASCENDING)
    # Site 1: <g1, g2> = -1 -> (0.6, 0.2); <(0.6, 0.2), g3> = -0.2 -> (0.48, -0.04)
    np.testing.assert_allclose(hat[0], [0.48, -0.04])
    # Site 2: <g2, g1> = -1 -> (-0.6, 0.8); <(-0.6, 0.8), g3> = -0.8 -> (-0.48, 0.44)
    np.testing.assert_allclose(hat[1], [-0.48, 0.44])
    # Site 3: <g3, g1> = 0, no change; <g3, g2> = -1 -> (-0.2, -0.6)
    np.testing.assert_allclose(hat[2], [-0.2, -0.6])
    np.testing.assert_allclose(hat.mean(axis=0), [-0.2 / 3, -0.2 / 3])
    np.testing.assert_allclose(g.mean(axis=0), [0.0, 0.0])  # the plain mean differs


def test_hand_worked_three_sites_count_their_corrections():
    g = np.array([[1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]])
    result = align(g, 0.1, ASCENDING)
    # As above: site 1 is corrected by sites 2 and 3, site 2 by sites 1 and 3, site 3 by site 2 only
    # (<g3, g1> = 0 is no conflict): 2 + 2 + 1 = 5 corrections.
    assert result.corrections == 5
    np.testing.assert_array_equal(result.updates, align_updates(g, 0.1, ASCENDING))
    # Site 3 visiting site 2 first: <g3, g2> = -1 -> (-0.2, -0.6); <(-0.2, -0.6), g1> = -0.2 -> (0.04, -0.48).
    assert align(g, 0.1, [[1, 2], [0, 2], [1, 0]]).corrections == 6
    assert align(np.array([[1.0, 2.0], [0.5, 0.1], [3.0, 0.0]]), 0.1, ASCENDING).corrections == 0


def test_no_conflict_gives_the_plain_mean():
    g = np.array([[1.0, 2.0], [0.5, 0.1], [3.0, 0.0]])
    np.testing.assert_allclose(aligned_mean(g, 0.1, ASCENDING), g.mean(axis=0))


def test_two_sites_always_give_the_plain_mean():
    g = np.array([[1.0, 0.0], [-1.0, 0.5]])
    np.testing.assert_allclose(aligned_mean(g, 0.1, [[1], [0]]), g.mean(axis=0))


def _reference(g, lam, orders):
    """Independent, element-wise restatement of Algorithm 1 with the running g_hat."""
    out = []
    for i, order in enumerate(orders):
        hat = [float(x) for x in g[i]]
        for j in order:
            dot = sum(a * b for a, b in zip(hat, g[j]))
            if dot < 0:
                hat = [a - 2 * lam * (a - b) for a, b in zip(hat, g[j])]
        out.append(hat)
    return np.array(out)


@pytest.mark.parametrize("seed", range(5))
def test_random_data_matches_an_independent_loop(seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(5, 7))
    orders = random_orders(5, np.random.default_rng(seed + 100))
    np.testing.assert_allclose(align_updates(g, 0.1, orders), _reference(g, 0.1, orders), atol=1e-12)


def test_seeded_orders_are_reproducible_and_visit_every_other_site():
    a = random_orders(5, np.random.default_rng(3))
    assert a == random_orders(5, np.random.default_rng(3))
    assert all(sorted(o) == [j for j in range(5) if j != i] for i, o in enumerate(a))


def test_bad_orders_are_rejected():
    with pytest.raises(ValueError):
        align_updates(np.zeros((3, 2)), 0.1, [[1], [0, 2], [0, 1]])
