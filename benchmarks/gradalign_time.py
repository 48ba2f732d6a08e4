"""Aggregation time of gradient alignment versus a plain mean of the same updates, measured side by side.

    python benchmarks/gradalign_time.py [--sites 5] [--repeats 5]

Uses the prostate jobs' default network (its parameter count) and random weight differences of that size;
prints both times and their ratio as measured on this machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from feddg.experiment import experiment_from_dict
from feddg.flare.gradalign.aggregator import GradientAlignmentAggregator
from feddg.jobs import experiment
from feddg.nets.unet import build_model


def plain_mean(updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.mean([u[k] for u in updates], axis=0) for k in updates[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shapes = {k: v.shape for k, v in build_model(experiment_from_dict(experiment("prostate", "gradalign"))).state_dict().items()}
    rng = np.random.default_rng(0)
    updates = [{k: rng.normal(scale=1e-3, size=s).astype(np.float32) for k, s in shapes.items()}
               for _ in range(args.sites)]
    n_params = sum(int(np.prod(s)) for s in shapes.values())
    agg = GradientAlignmentAggregator()

    def aligned() -> None:
        agg.reset_stats()
        for i, u in enumerate(updates):
            agg.accept_model(FLModel(params=u, params_type=ParamsType.DIFF, meta={"client_name": f"site{i}"}))
        agg.aggregate_model()

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        return best

    t_plain = timed(lambda: plain_mean(updates))
    t_aligned = timed(aligned)
    print(f"{args.sites} sites, {n_params:,} parameters, best of {args.repeats}")
    print(f"plain mean:        {t_plain * 1e3:8.2f} ms")
    print(f"gradient aligned:  {t_aligned * 1e3:8.2f} ms")
    print(f"ratio aligned / plain: {t_aligned / t_plain:.1f}")


if __name__ == "__main__":
    main()
