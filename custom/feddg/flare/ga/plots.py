"""GA's plot in a benchmark folder: the sites' GA weights over the rounds of a few runs (``ga_weights.png``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from feddg.flare.ga.part import HISTORY

MAX_RUNS = 4  # panels side by side


def weight_history(records: Sequence[dict[str, Any]]):
    """One panel per run (the first :data:`MAX_RUNS`): each training site's weight a_i after every round.

    Args:
        records: finished runs' records holding GA's kept history under ``HISTORY.key``.
    Returns:
        the matplotlib figure.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    runs = list(records)[:MAX_RUNS]
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.5), squeeze=False)
    for ax, record in zip(axes[0], runs):
        history = record[HISTORY.key]["history"]
        for site in history[-1]["weights"]:
            ax.plot([h["round"] for h in history], [h["weights"].get(site, np.nan) for h in history], label=site)
        ax.set(title=f"{record['run']['method']}, held out {record['run']['held_out']}", xlabel="round",
               ylabel="GA weight")
        ax.legend(fontsize=7)
    return fig
