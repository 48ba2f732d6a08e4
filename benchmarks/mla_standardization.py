"""Whether MLA's domain attention module (DAM) needs its input standardization: the DAM trained on the same
feature bank with and without it, side by side, at several epoch counts.

    python benchmarks/mla_standardization.py [--task prostate] [--seeds 0-4] [--epochs 5,10,25,50,100]
                                             [--bundle RUN/mla_bundle]

Eq. (3) of MLA-BIN feeds the encoder's feature vectors straight into the 1x1 convolution; this project
standardizes each feature with the bank's mean and standard deviation first
(:mod:`feddg.methods.mla.attention`). This script measures that choice on the task's default ``mlabin`` job
(synthetic data unless ``data.root`` is set with ``--set``): every training site's training images are mapped by the
random encoder of Eq. (2), as the sites do in the job; the DAM is trained with the job's settings (Adam, the
paper's learning rate 1e-3, batch 8) for each epoch count and seed, once with the standardization and once without
(``train_domain_attention(..., standardize=False)``). A run of E epochs is the first E epochs of a longer one (same
seed, same initialization and shuffling), so the rows are one training curve.

Printed per variant and epoch count, as the mean over the seeds (lowest and highest in brackets):
* ``bank``: the accuracy on the feature bank it trained on (what the job logs);
* ``validation``: the accuracy on the training sites' validation images, which the DAM never saw (the image's
  own site must get the largest weight);
* ``unseen weights``: the unseen site's mean attention weights D^w (``attention_weights``, mode ``mean``), the
  weights the job combines the local models with;
* with ``--bundle`` (the ``mla_bundle`` folder of a finished ``mlabin`` job, e.g.
  ``feddg simulate jobs/prostate_mlabin -w /tmp/feddg/prostate_mlabin`` then
  ``/tmp/feddg/prostate_mlabin/server/simulate_job/mla_bundle``): the unseen site's Dice of the job's local models
  combined with those weights (Eq. 4), the number MLA reports. The bundle's own experiment then replaces the
  task's defaults (its data, its encoder), and ``--task`` and ``--set`` are not used. Printed first: the bundle's
  own module's weights and Dice (the standardized row at the job's epochs and seed repeats them) and the Dice of
  the local models averaged uniformly, the combination without attention.
Also the range of the raw features' per-feature means and standard deviations, the scales the DAM would otherwise
have to learn.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from feddg.benchmark.sweep import parse_seeds
from feddg.data.dataset import load_site
from feddg.evaluation import evaluate_sliceset, mean_dice
from feddg.experiment import experiment_from_dict, parse_overrides
from feddg.flare.mla.bundle import load_bundle
from feddg.flare.mla.settings import random_feature_encoder
from feddg.jobs import experiment
from feddg.methods.mla.attention import attention_weights, site_accuracy, train_domain_attention
from feddg.methods.mla.encoders import encode
from feddg.numerics import host_family
from feddg.report import script_command


def accuracy(module: torch.nn.Module, features: dict[str, np.ndarray], order: list[str]) -> float:
    """The share of all vectors whose largest DAM output is their own site (``site_accuracy`` weighted by count)."""
    per_site = site_accuracy(module, features, order)
    return sum(per_site[s] * len(features[s]) for s in order) / sum(len(features[s]) for s in order)


def spread(values: list[float]) -> str:
    return f"{np.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="prostate", choices=["prostate", "fundus"])
    parser.add_argument("--seeds", default="0-4", help="DAM seeds (initialization and shuffling), e.g. 0-4")
    parser.add_argument("--epochs", default="5,10,25,50,100", help="comma-separated epoch counts")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a feddg.yaml override of the mlabin job (repeatable)")
    parser.add_argument("--bundle", default=None, help="an mlabin job's mla_bundle folder: also score the unseen "
                                                       "site with its local models combined by each DAM's weights")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    epochs = sorted({int(e) for e in args.epochs.split(",")})
    bundle = load_bundle(args.bundle) if args.bundle else None
    if bundle is not None:
        cfg, encoder = bundle.config, bundle.encoder
        if bundle.sites != list(cfg.data.train_sites):
            raise SystemExit(f"{args.bundle}: the bundle's sites {bundle.sites} are not its experiment's training "
                             f"sites {list(cfg.data.train_sites)} (a site left out of MLA)")
    else:
        cfg = experiment_from_dict(experiment(args.task, "mlabin", parse_overrides(args.overrides)))
        encoder = random_feature_encoder(cfg)
    m = cfg.mla
    print(f"Made by `{script_command('benchmarks/mla_standardization.py', argv)}` on {host_family('off')}.\n")
    bank, held_aside = {}, {}
    for site in cfg.data.train_sites:
        splits = load_site(cfg.data, site)
        bank[site] = encode(encoder, splits["train"].images, batch_size=cfg.eval.batch_size)
        held_aside[site] = encode(encoder, splits["val"].images, batch_size=cfg.eval.batch_size)
    test = load_site(cfg.data, cfg.data.unseen_site)["test"]
    unseen = encode(encoder, test.images, batch_size=cfg.eval.batch_size)

    def unseen_dice(weights: np.ndarray) -> float:
        summary = evaluate_sliceset(bundle.model_for(weights), test, cfg.data.label_names, torch.device("cpu"),
                                    cfg.eval.batch_size)["summary"]
        return mean_dice(summary, cfg.data.label_names)

    stacked = np.concatenate(list(bank.values()))
    means, stds = stacked.mean(axis=0), stacked.std(axis=0)
    print(f"{args.task}: {len(stacked)} bank vectors of {stacked.shape[1]} features from {list(bank)}; "
          f"{sum(len(v) for v in held_aside.values())} validation vectors; unseen {cfg.data.unseen_site}: "
          f"{len(unseen)} test images")
    print(f"raw features: per-feature mean {means.min():.3g} to {means.max():.3g}, "
          f"standard deviation {stds.min():.3g} to {stds.max():.3g}")
    if bundle is not None:  # the job's own module: the standardized row at its epochs and seed should repeat it
        w = bundle.weights(test.images, "mean")
        print(f"the bundle's own DAM ({m.attention_epochs} epochs, seed {m.attention_seed}): "
              f"{cfg.data.unseen_site}'s weights " + ", ".join(f"{s} {v:.2f}" for s, v in zip(bundle.sites, w))
              + f"; {cfg.data.unseen_site} Dice {unseen_dice(w):.3f}; with the local models averaged uniformly "
              f"(1/K, no attention): {unseen_dice(np.full(len(bundle.sites), 1 / len(bundle.sites))):.3f}")
    print(f"DAM: Adam lr {m.attention_lr}, batch {m.attention_batch_size}, seeds {args.seeds}; "
          f"mean over the seeds [lowest, highest]\n")
    dice_head = f" {cfg.data.unseen_site} Dice |" if bundle is not None else ""
    print(f"| input | epochs | bank accuracy | validation accuracy | {cfg.data.unseen_site}'s weights |{dice_head}")
    print("| --- " * (5 + (bundle is not None)) + "|")
    for standardize in (True, False):
        name = "standardized (the jobs)" if standardize else "raw (Eq. 3 as printed)"
        for e in epochs:
            on_bank, on_val, weights, dice = [], [], [], []
            for seed in seeds:
                module, order, bank_accuracy = train_domain_attention(
                    bank, epochs=e, lr=m.attention_lr, seed=seed, batch_size=m.attention_batch_size,
                    conv_channels=m.attention_conv_channels, hidden=m.attention_hidden, standardize=standardize)
                on_bank.append(bank_accuracy)
                on_val.append(accuracy(module, held_aside, order))
                weights.append(attention_weights(module, unseen).numpy())
                if bundle is not None:
                    dice.append(unseen_dice(weights[-1]))
            w = np.mean(weights, axis=0)
            shown = ", ".join(f"{s} {v:.2f}" for s, v in zip(order, w))
            scored = f" {spread(dice)} |" if dice else ""
            print(f"| {name} | {e} | {spread(on_bank)} | {spread(on_val)} | {shown} |{scored}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
