"""The plots of a results folder (``plots/``): validation Dice per round, each method's own plots of the server
files its runs kept (GA's weights over rounds), and held-out Dice per site with every seed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feddg.benchmark.record import finished
from feddg.benchmark.scores import seed_dice


def plots(records: Sequence[dict[str, Any]], out: Path, methods: Sequence[str], held_out: Sequence[str]) -> list[Path]:
    """PNG plots: validation Dice per round per method; each kept server file's plot (GA's weights over rounds);
    held-out Dice per site (bars: mean over seeds, error bars: seed SD, dots: each seed)."""
    import importlib

    import matplotlib

    from feddg.flare.registry import server_files

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    ok = finished(records)

    fig, ax = plt.subplots(figsize=(7, 4))
    for method in methods:
        curves = [[h["mean_val_dice"] for h in r["report"].get("history", [])] for r in ok
                  if r["run"]["method"] == method]
        curves = [c for c in curves if c]
        if curves:
            n = min(map(len, curves))
            ax.plot(range(n), np.mean([c[:n] for c in curves], axis=0), marker="o" if n <= 30 else None,
                    label=method)
    ax.set(xlabel="round", ylabel="mean validation Dice of the received model",
           title="Validation Dice per round (mean over held-out sites and seeds)")
    if ax.lines:  # no finished run: an empty frame, without a legend
        ax.legend(fontsize=8)
    written.append(_save(fig, out / "validation_dice.png"))

    for file in server_files():  # the methods' own plots of what their runs kept (GA: the weights over rounds)
        holding = [r for r in ok if r.get(file.key)]
        if file.plot and holding:
            module, _, function = file.plot.partition(":")
            written.append(_save(getattr(importlib.import_module(module), function)(holding), out / f"{file.key}.png"))

    table = seed_dice(ok)
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(held_out)), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        x = np.arange(len(held_out)) + i * width
        per_site = [list(table.get((method, site), {}).values()) for site in held_out]
        means = [np.mean(v) if v else np.nan for v in per_site]
        sds = [np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in per_site]
        ax.bar(x, means, width, yerr=sds, capsize=2, label=method)
        for xi, values in zip(x, per_site):
            ax.plot([xi] * len(values), values, ".", color="black", markersize=3)
    ax.set_xticks(np.arange(len(held_out)) + width * (len(methods) - 1) / 2, held_out)
    ax.set(ylabel="held-out Dice (mean over seeds, SD bars, dots: seeds)", ylim=(0, 1), title="Held-out Dice per site")
    ax.legend(fontsize=7, ncol=2)
    written.append(_save(fig, out / "held_out_dice.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
