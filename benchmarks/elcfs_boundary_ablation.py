"""Which parts of ELCFS's local step help, on one site, measured side by side from the same initial model.

    python benchmarks/elcfs_boundary_ablation.py [--task prostate] [--site BIDMC] [--epochs 10]

Trains a task's default network on one synthetic training site (``jobs/<task>_elcfs`` settings,
amplitude bank of the other training sites) with: plain training (FedAvg's local step), the episodic step without
the boundary term, and with the boundary term of Eq. (6)-(7) using the printed denominator (negatives only) at the
paper's two gammas and the SimCLR denominator (all other features). Prints Dice on the site's validation split and
on the unseen site's test images. Seeded; one run per variant.
"""

from __future__ import annotations

import argparse
import time

import torch

from feddg.data.dataset import load_site, make_loader
from feddg.evaluation import evaluate_sliceset, mean_dice
from feddg.experiment import experiment_from_dict
from feddg.flare.elcfs.payloads import amplitude_half_widths
from feddg.jobs import experiment
from feddg.methods.boundary import boundary_loss
from feddg.methods.episodic import train_episodic
from feddg.methods.frequency import amplitude_window
from feddg.nets.unet import build_model, select_device
from feddg.training import iterate_batches, local_optimizer, segmentation_loss, train_epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="prostate", choices=["prostate", "fundus"])
    parser.add_argument("--site", default=None, help="default: the first training site")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    cfg = experiment_from_dict(experiment(args.task, "elcfs"))
    args.site = args.site or cfg.data.train_sites[0]
    device = select_device()
    data = load_site(cfg.data, args.site)
    size = cfg.data.image_size
    hw = amplitude_half_widths(cfg)
    bank = {s: torch.as_tensor(amplitude_window(load_site(cfg.data, s)["train"].images, hw), device=device)
            for s in cfg.data.train_sites if s != args.site}
    unseen = load_site(cfg.data, cfg.data.unseen_site)["test"]
    names = cfg.data.label_names

    def dice(model, split) -> str:
        summary = evaluate_sliceset(model, split, names, device, cfg.eval.batch_size)["summary"]
        if len(names) == 1:
            return f"{mean_dice(summary, names):.3f}"
        return "/".join(f"{summary[n]['dice']['mean']:.3f}" for n in names)

    variants = {
        "plain training (FedAvg's local step)": None,
        "episodic, no boundary term": (0.0, "negatives"),
        "episodic + boundary, printed Eq. 6, gamma 0.5": (0.5, "negatives"),
        "episodic + boundary, printed Eq. 6, gamma 0.1": (0.1, "negatives"),
        "episodic + boundary, all-others denominator, gamma 0.5": (0.5, "all"),
        "episodic + boundary, all-others denominator, gamma 0.1": (0.1, "all"),
    }
    print(f"site {args.site}, {args.epochs} epochs, {size} px, unseen {cfg.data.unseen_site}")
    print(f"{'variant':<58}{'val Dice':>14}{'unseen Dice':>14}{'time s':>8}   ({'/'.join(names)})")
    for name, spec in variants.items():
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg).to(device)
        opt = local_optimizer(model.parameters(), cfg.train.lr)
        loader = make_loader(data["train"], cfg.train.batch_size, shuffle=True, augment=True, seed=0)
        start = time.perf_counter()
        if spec is None:
            train_epochs(model, loader, opt, args.epochs, device)
        else:
            gamma, denominator = spec
            e = cfg.elcfs

            def boundary(f, y, v, denominator=denominator):
                return boundary_loss(f, y, v, e.temperature, e.dilation_iterations, denominator)

            train_episodic(model, iterate_batches(loader, args.epochs, None), opt, device, bank, args.site,
                           segmentation_loss(), boundary if gamma > 0 else None, boundary_weight=gamma, seed=0)
        elapsed = time.perf_counter() - start
        print(f"{name:<58}{dice(model, data['val']):>14}{dice(model, unseen):>14}{elapsed:>8.1f}")


if __name__ == "__main__":
    main()
