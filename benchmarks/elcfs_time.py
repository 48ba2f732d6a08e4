"""Local epoch time of ELCFS versus FedAvg on the same data and model, measured side by side in one run.

    python benchmarks/elcfs_time.py [--task prostate] [--site BIDMC] [--steps 20] [--repeats 3]

Uses the job's default configuration (``jobs/<task>_elcfs``: image size, network, batch size) on the synthetic
sites, and a distribution bank built from the other training sites exactly as the amplitude exchange builds it.
For each variant it times ``--steps`` optimizer steps on the same batches, keeps the best of ``--repeats``
interleaved runs, and prints the ratio to FedAvg next to the floor (2 + n_t): one forward/backward of x for the
inner step plus one of the stacked [x; t] (1 + n_t images per image) for the meta step. It also prints the share
of the step spent in the frequency-space work (building t), timed on its own.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from feddg.data.dataset import load_site, make_loader
from feddg.experiment import experiment_from_dict
from feddg.flare.elcfs.payloads import amplitude_half_widths
from feddg.jobs import experiment
from feddg.methods.boundary import boundary_loss
from feddg.methods.episodic import train_episodic, transformed_views
from feddg.methods.frequency import amplitude_window
from feddg.nets.unet import build_model, select_device
from feddg.training import local_optimizer, segmentation_loss, train_epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="prostate", choices=["prostate", "fundus"])
    parser.add_argument("--site", default=None, help="the training site whose data is used (default: the first)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    cfg = experiment_from_dict(experiment(args.task, "elcfs"))
    device = select_device()
    sites = cfg.data.train_sites
    site = args.site or sites[0]
    data = load_site(cfg.data, site)["train"]
    size = cfg.data.image_size
    hw = amplitude_half_widths(cfg)
    bank = {s: torch.as_tensor(amplitude_window(load_site(cfg.data, s)["train"].images, hw), device=device)
            for s in sites if s != site}
    loader = make_loader(data, cfg.train.batch_size, shuffle=True, augment=False, seed=0)
    batches = []
    while len(batches) < args.steps:
        batches.extend(loader)
    batches = batches[:args.steps]
    start = build_model(cfg).to(device)
    e = cfg.elcfs

    def fedavg() -> None:
        model = copy.deepcopy(start)
        train_epochs(model, batches, local_optimizer(model.parameters(), 1e-3), 1, device)

    def elcfs(n_t: int) -> None:
        model = copy.deepcopy(start)
        train_episodic(model, batches, local_optimizer(model.parameters(), 1e-3), device, bank,
                       site, segmentation_loss(),
                       lambda f, y, v: boundary_loss(f, y, v, e.temperature, e.dilation_iterations,
                                                     e.contrast_denominator),
                       transforms_per_image=n_t, boundary_weight=e.boundary_weight, seed=0)

    def frequency(n_t: int) -> None:
        g = torch.Generator().manual_seed(0)
        for b in batches:
            transformed_views(b["image"].to(device), bank, site, n_t, (0.0, 1.0), g)

    all_others = len(bank)
    variants = {"fedavg": fedavg}
    for n_t in sorted({1, all_others}):
        variants[f"elcfs n_t={n_t}"] = lambda n=n_t: elcfs(n)
        variants[f"frequency only n_t={n_t}"] = lambda n=n_t: frequency(n)
    best = {name: float("inf") for name in variants}
    fedavg()  # warm-up
    for _ in range(args.repeats):  # interleaved, so that machine noise hits every variant alike
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)

    print(f"{args.task}, site {site}: {args.steps} steps of batch {cfg.train.batch_size} at {size} px on {device}, "
          f"window {2 * hw[0] + 1}x{2 * hw[1] + 1}, best of {args.repeats}")
    print(f"{'variant':<22}{'s / step':>10}{'x FedAvg':>10}{'floor':>8}{'x floor':>9}{'frequency share':>17}")
    base = best["fedavg"] / args.steps
    print(f"{'fedavg':<22}{base:>10.4f}{1.0:>10.2f}")
    for n_t in sorted({1, all_others}):
        step = best[f"elcfs n_t={n_t}"] / args.steps
        share = best[f"frequency only n_t={n_t}"] / best[f"elcfs n_t={n_t}"]
        floor = 2 + n_t
        print(f"{f'elcfs n_t={n_t}':<22}{step:>10.4f}{step / base:>10.2f}{floor:>8d}{step / base / floor:>9.2f}"
              f"{share:>16.1%}")


if __name__ == "__main__":
    main()
