"""Gradient alignment for privacy-preserving constrained domain generalization, section 3.2, Algorithm 1, Eq. (5).

Pure numpy. The sites' updates (local model minus the global model they received, the paper's "gradients") are
rows of a matrix; every site's update is corrected against the others it conflicts with, then they are averaged::

    for each site i:
        g_hat = g_i
        for each other site j, in a random order:
            if <g_hat, g_j> < 0:                      (negative transfer)
                g_hat = g_hat - 2 * lambda * (g_hat - g_j)
    aggregate = mean_i g_hat_i

Choices the paper leaves open, written down here:
  * The running corrected update g_hat is used both in the conflict test and in the correction. The other reading
    of Algorithm 1 (test and correct against the original g_i and sum the corrections) makes the corrections of
    every conflicting pair cancel in the mean: -2 lambda (g_i - g_j) - 2 lambda (g_j - g_i) = 0, so the aggregate
    would always be the plain mean and the method would do nothing. For the same reason two sites alone always
    give the plain mean here too: each is pulled towards the other by the same amount. A third, literal reading
    (line 5 recomputes g_hat_i from the original g_i at each conflicting j) keeps only the last conflicting site's
    correction; the text's "we repeat this process ... in a random order" reads as the running update. Line 4 as
    printed tests <g_i, g_j>; testing the running g_hat is this module's choice (a corrected update may no longer
    conflict). None of the readings was measured against the others (docs/methods.md).
  * The order of the other sites is random per site (seeded; injectable for tests).
  * Inner products run over all aligned parameters flattened together, in float64.
  * No conflicting pair: the aggregate equals the plain mean.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np


def random_orders(num_sites: int, rng: np.random.Generator) -> list[list[int]]:
    """For each site i, the other sites in a random order."""
    return [[int(j) for j in rng.permutation([j for j in range(num_sites) if j != i])] for i in range(num_sites)]


class Alignment(NamedTuple):
    """The outcome of Algorithm 1 on one round's updates."""

    updates: np.ndarray  # the corrected updates g_hat_i (K, P), float64
    corrections: int  # how many (i, j) corrections were applied: the visits where <g_hat, g_j> < 0


def align(
    updates: np.ndarray, lam: float = 0.1, orders: Sequence[Sequence[int]] | None = None,
    rng: np.random.Generator | None = None,
) -> Alignment:
    """The corrected updates g_hat_i (K, P) of the site updates ``updates`` (K, P), Algorithm 1, and the number of
    corrections applied.

    Args:
        updates: one flattened update per row.
        lam: lambda of Eq. (5), 0.1 in the paper.
        orders: ``orders[i]`` lists the other sites in the order site i visits them; default: random from ``rng``.
        rng: generator for the default orders (seed it for a reproducible run).
    """
    g = np.asarray(updates, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"updates must be (sites, parameters), got shape {g.shape}")
    k = g.shape[0]
    if orders is None:
        orders = random_orders(k, rng if rng is not None else np.random.default_rng(0))
    if len(orders) != k or any(sorted(o) != [j for j in range(k) if j != i] for i, o in enumerate(orders)):
        raise ValueError(f"orders must list, for each of the {k} sites, every other site once: {orders}")
    aligned = g.copy()
    corrections = 0
    for i in range(k):
        g_hat = aligned[i]
        for j in orders[i]:
            if float(g_hat @ g[j]) < 0.0:
                g_hat = g_hat - 2.0 * lam * (g_hat - g[j])
                corrections += 1
        aligned[i] = g_hat
    return Alignment(aligned, corrections)


def align_updates(
    updates: np.ndarray, lam: float = 0.1, orders: Sequence[Sequence[int]] | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """The corrected updates g_hat_i (K, P) of :func:`align` alone."""
    return align(updates, lam, orders, rng).updates


def aligned_mean(updates: np.ndarray, lam: float = 0.1, orders: Sequence[Sequence[int]] | None = None,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The aggregate (P,): the mean of the corrected updates."""
    return align_updates(updates, lam, orders, rng).mean(axis=0)
