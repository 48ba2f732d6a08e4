"""The training augmentation's cost per round, batched on the device against MONAI's per-sample dictionary
transforms, measured side by side in one run.

    python benchmarks/augmentation_time.py [--job prostate_ga] [--site BIDMC] [--threads 1] [--repeats 3]

Both produce one round's batches of the site (``train.local_epochs`` passes over its training slices, the job's
batch size, image size and seed) without training on them: the per-sample pipeline is the one the project used
before (MONAI ``RandRotated`` ±15° p 0.5 -> ``RandZoomd`` 0.9-1.1 p 0.5 -> ``RandFlipd`` on each axis p 0.5, in the
DataLoader on the training thread), the batched one is :mod:`feddg.data.transforms`. Best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

JOBS = Path(__file__).resolve().parents[1] / "jobs"


def per_sample_loader(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int):
    from monai.transforms import Compose, RandFlipd, RandRotated, RandZoomd

    keys = ("image", "label")
    transform = Compose([
        RandRotated(keys, range_x=math.radians(15), prob=0.5, keep_size=True, mode=("bilinear", "nearest"),
                    padding_mode="zeros"),
        RandZoomd(keys, min_zoom=0.9, max_zoom=1.1, prob=0.5, keep_size=True, mode=("bilinear", "nearest-exact"),
                  padding_mode="constant"),
        RandFlipd(keys, prob=0.5, spatial_axis=0),
        RandFlipd(keys, prob=0.5, spatial_axis=1),
    ])
    transform.set_random_state(seed=seed)

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return len(images)

        def __getitem__(self, i):
            item = transform({"image": images[i], "label": labels[i].astype(np.float32)})
            return {k: torch.as_tensor(v.as_tensor() if hasattr(v, "as_tensor") else v) for k, v in item.items()}

    return torch.utils.data.DataLoader(Samples(), batch_size=batch_size, shuffle=True,
                                       generator=torch.Generator().manual_seed(seed))


def timed(make, epochs: int, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        loader = make()
        started = time.perf_counter()
        for _ in range(epochs):
            for _batch in loader:
                pass
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default="prostate_ga")
    parser.add_argument("--site", default=None, help="a training site (default: the first)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a site's budget)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from feddg.data.dataset import load_site, make_loader
    from feddg.experiment import load_experiment
    from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections

    cfg = load_experiment(JOBS / args.job / "app" / "config" / "feddg.yaml")
    site = args.site or cfg.data.train_sites[0]
    train = load_site(cfg.data, site)["train"]
    t = cfg.train
    monai = timed(lambda: per_sample_loader(train.images, train.labels, t.batch_size, t.seed), t.local_epochs,
                  args.repeats)
    batched = timed(lambda: make_loader(train, t.batch_size, True, True, t.seed), t.local_epochs, args.repeats)
    plain = timed(lambda: make_loader(train, t.batch_size, True, False, t.seed), t.local_epochs, args.repeats)
    print(f"{args.job}, site {site}: {len(train)} training slices of {cfg.data.image_size} px, batch {t.batch_size}, "
          f"{t.local_epochs} epochs, {args.threads} thread(s), best of {args.repeats}")
    print(f"  MONAI per-sample transforms : {monai:7.3f} s a round")
    print(f"  batched on the device       : {batched:7.3f} s a round ({monai / batched:.1f}x faster)")
    print(f"  no augmentation (batches)   : {plain:7.3f} s a round")


if __name__ == "__main__":
    main()
