"""The client script of the ``recipe`` anchor (:mod:`anchors`): NVFlare 2.9's Client API around the same local work
as our site's ``train`` task, i.e. validate the received model on the site's validation split, train
``train.local_epochs`` epochs with the job's batches and learning rate, send the weights back.

    python anchor_train.py --config FEDDG_YAML      (started by NVFlare's ClientAPIExecutor, in process)
"""

from __future__ import annotations

import argparse

import nvflare.client as flare
import torch

from feddg.compute import apply_thread_budget
from feddg.experiment import load_experiment
from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections
from feddg.data.dataset import load_site, make_loader
from feddg.evaluation import validation_scores
from feddg.nets.unet import build_model, select_device
from feddg.precision import Precision
from feddg.seeds import round_seed
from feddg.training import local_optimizer, train_epochs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    flare.init()
    site = flare.get_site_name()
    cfg = load_experiment(args.config)
    apply_thread_budget()
    device = select_device()
    data = load_site(cfg.data, site)
    model = build_model(cfg).to(device)
    optimizer = local_optimizer(model.parameters(), cfg.train.lr)
    precision = Precision(cfg.train.amp, device)
    while flare.is_running():
        received = flare.receive()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in received.params.items()})
        if len(data["val"]):
            validation_scores(model, data["val"], cfg.data.label_names, device, cfg.eval.batch_size)
        seed = round_seed(cfg.train.seed, site, received.current_round or 0)
        torch.manual_seed(seed)
        loader = make_loader(data["train"], cfg.train.batch_size, True, cfg.train.augment, seed, device)
        result = train_epochs(model, loader, optimizer, cfg.train.local_epochs, device, 0.0, None,
                              cfg.train.local_steps, precision)
        flare.send(flare.FLModel(params={k: v.cpu() for k, v in model.state_dict().items()},
                                 meta={"NUM_STEPS_CURRENT_ROUND": result.steps}))


if __name__ == "__main__":
    main()
