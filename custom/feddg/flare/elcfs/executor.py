"""The site's Executor for ELCFS: the amplitude exchange and boundary-oriented episodic local training.

Tasks, on top of :class:`feddg.flare.executor.FedDGExecutor`'s ``train`` and ``evaluate``:
  * ``amplitude_spectra``: in, nothing. Out (DXO ``AMPLITUDE_WINDOW``): the centred low-frequency window of the
    amplitude spectrum of each contributed training image (:func:`feddg.methods.frequency.amplitude_window`), as
    the network receives it (after the project's intensity normalisation). A site contributes all its training
    images, or a seeded random subset of at most ``elcfs.bank_images`` (the job) and ``amplitude_bank_images``
    (the site's own ``local/feddg_site.json``), whichever is smaller.
  * ``amplitude_bank``: in (DXO ``AMPLITUDE_BANK``), the distribution bank. The site checks it (window shape,
    finite, non-negative, known training sites only), keeps the other sites' entries in its run folder
    (``feddg_site_state/amplitude_bank.npz``: with ``nvflare simulator -t 1`` every task runs in a fresh process)
    and acknowledges with an empty OK reply.
  * ``train``: local training is the episodic step of ELCFS (:func:`feddg.methods.episodic.train_episodic`) on
    each batch x with its frequency-space counterparts t; the result is the same as FedAvg's (weights + metadata).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply


from feddg.flare.elcfs.payloads import ELCFSTask, amplitude_half_widths, amplitude_window_dxo, check_amplitude_bank
from feddg.flare.executor import FedDGExecutor, LocalTrainingError, TaskHandler
from feddg.flare.payloads import PayloadRejected, smallest_cap
from feddg.flare.site_config import load_site_config
from feddg.methods.boundary import boundary_loss
from feddg.methods.episodic import train_episodic
from feddg.methods.frequency import amplitude_window
from feddg.seeds import round_seed
from feddg.training import LocalTrainResult, iterate_batches, segmentation_loss

BANK_FILE = "amplitude_bank.npz"


class ELCFSExecutor(FedDGExecutor):
    """ELCFS at a site.

    Args:
        exchange_task_name: the task that asks for the amplitude windows.
        bank_task_name: the task that delivers the distribution bank.
        args, kwargs: :class:`FedDGExecutor`'s arguments (``config_file``, ``tb_writer_id``, ``site_hooks``, ...);
            the job's ``feddg.yaml`` holds the method's settings in its ``elcfs`` section (ELCFS local training
            combines with any aggregator: GA needs the generalization gap). Literally ``*args, **kwargs``:
            NVFlare's job export (``fuel/utils/class_utils.py``) reads a base class's arguments only then.
    """

    def __init__(
        self,
        exchange_task_name: str = ELCFSTask.AMPLITUDE_SPECTRA,
        bank_task_name: str = ELCFSTask.AMPLITUDE_BANK,
        *args: Any,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.exchange_task_name = exchange_task_name
        self.bank_task_name = bank_task_name
        refusal = "it takes no part in the amplitude exchange"
        self.handlers[exchange_task_name] = TaskHandler(lambda _, fl_ctx, __: self._send_windows(fl_ctx),
                                                        unseen_site_refuses=True, refusal=refusal)
        self.handlers[bank_task_name] = TaskHandler(lambda shareable, fl_ctx, _: self._store_bank(shareable, fl_ctx),
                                                    unseen_site_refuses=True, refusal=refusal)

    # ------------------------------------------------------------------ the exchange
    def _send_windows(self, fl_ctx: FLContext) -> Shareable:
        train = self._data["train"]
        cap = smallest_cap(self._cfg.elcfs.bank_images, load_site_config(fl_ctx).amplitude_bank_images)
        n = len(train)
        rows = np.arange(n)
        if cap is not None and cap < n:
            rng = np.random.default_rng(round_seed(self._cfg.train.seed, self._site, 0))
            rows = np.sort(rng.choice(n, size=cap, replace=False))
        hw = amplitude_half_widths(self._cfg)
        windows = amplitude_window(train.images[rows], hw)
        size = tuple(train.images.shape[-2:])
        self.log_info(fl_ctx, f"site {self._site}: sending the amplitude windows of {len(rows)} of {n} training "
                              f"images ({windows.shape[1]} x {windows.shape[2]} x {windows.shape[3]} values each)")
        return amplitude_window_dxo(windows, hw, size).to_shareable()

    def _store_bank(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        try:
            hw = amplitude_half_widths(self._cfg)
            bank = check_amplitude_bank(from_shareable(shareable), hw, max(hw), known_sites=self._cfg.data.train_sites)
        except (PayloadRejected, ValueError) as e:
            self.log_error(fl_ctx, f"site {self._site}: refused the amplitude bank: {e}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        channels = self._cfg.data.in_channels
        others = {s: a for s, a in bank.items() if s != self._site and len(a)}
        wrong = sorted(s for s, a in others.items() if a.shape[1] != channels)
        if wrong:
            self.log_error(fl_ctx, f"site {self._site}: refused the amplitude bank: entries of {wrong} do not have "
                                   f"{channels} channel(s)")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        if not others:
            self.log_error(fl_ctx, f"site {self._site}: the amplitude bank holds no other site's spectra")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        path = os.path.join(self._state_dir(fl_ctx), BANK_FILE)
        tmp = path + ".tmp.npz"
        np.savez(tmp, **others)
        os.replace(tmp, path)
        self.log_info(fl_ctx, f"site {self._site}: stored the amplitude bank of {sorted(others)}")
        return make_reply(ReturnCode.OK)

    def _load_bank(self, fl_ctx: FLContext) -> dict[str, torch.Tensor]:
        path = os.path.join(self._state_dir(fl_ctx), BANK_FILE)
        if not os.path.exists(path):
            raise LocalTrainingError("no amplitude bank in the workspace: the amplitude exchange did not reach this "
                                     "site (it must run before the federated rounds)")
        with np.load(path) as f:
            return {s: torch.as_tensor(f[s], device=self._device) for s in f.files}

    # ------------------------------------------------------------------ local training
    def _local_train(self, model, loader, optimizer, global_model, seed: int, fl_ctx: FLContext) -> LocalTrainResult:
        cfg, e = self._cfg, self._cfg.elcfs
        if cfg.train.fedprox_mu > 0:
            raise LocalTrainingError("ELCFS local training has no FedProx term; set train.fedprox_mu to 0")
        bank = self._load_bank(fl_ctx)
        n_other = len(bank)
        n_t = e.transforms_per_image if e.transforms_per_image is None else min(e.transforms_per_image, n_other)

        def boundary(features, labels, views):
            return boundary_loss(features, labels, views, e.temperature, e.dilation_iterations,
                                 e.contrast_denominator)

        result = train_episodic(
            model, iterate_batches(loader, cfg.train.local_epochs, cfg.train.local_steps), optimizer, self._device,
            bank, self._site, segmentation_loss(), boundary if e.boundary_weight > 0 else None,
            transforms_per_image=n_t, lam_range=(e.lam_range[0], e.lam_range[1]), meta_step_size=e.meta_step_size,
            boundary_weight=e.boundary_weight, second_order=e.second_order, seed=seed, precision=self._precision,
        )
        return LocalTrainResult(mean_loss=result.mean_loss, steps=result.steps,
                                extra={"boundary_loss": result.mean_boundary})
