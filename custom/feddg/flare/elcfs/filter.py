"""The site's guard on the ELCFS amplitude exchange: an NVFlare Filter.

On the way out (task result chain) it lets the ``amplitude_spectra`` result leave only if it is exactly the
amplitude-window payload of :mod:`feddg.flare.elcfs.payloads`: the (2 b_h + 1) x (2 b_w + 1) window per channel
that the job's ``feddg.yaml`` implies (:func:`~feddg.flare.elcfs.payloads.amplitude_half_widths`, read at run time, so
that editing ``data.image_size`` or ``elcfs.alpha`` in a generated job cannot make the filter stale), floats, finite,
non-negative, at most ``elcfs.bank_images`` images (and at most ``max_images``), nothing else in the DXO, its meta
or the Shareable. A raw image, a phase, a full spectrum or an extra key is blocked: the filter logs the task and the
reason and raises :class:`~nvflare.apis.filter.ContentBlockedException`, so NVFlare sends the server an error reply
instead.

On the way in (task data chain) the same class validates the ``amplitude_bank`` a site receives.

Every other task passes untouched, so the filter can sit in a job's filter list for two tasks or in a site's
``privacy.json`` scope, where it sees every task (NVFlare runs site filters before the job's own); there its
arguments are the site's own caps, e.g. ``{"max_half_width": 4, "max_images": 200}``.
"""

from __future__ import annotations

from nvflare.apis.dxo import DXO

from feddg.config import FedDGConfig
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.elcfs.payloads import (
    DEFAULT_MAX_HALF_WIDTH,
    ELCFSTask,
    amplitude_half_widths,
    check_amplitude_bank,
    check_amplitude_payload,
)
from feddg.flare.payload_filter import Check, PayloadFilter
from feddg.flare.payloads import smallest_cap


class AmplitudeWindowFilter(PayloadFilter):
    """Blocks everything on the amplitude tasks except the job's amplitude-window payloads.

    Args:
        config_file: the job's ``feddg.yaml`` (image size, ``elcfs.alpha`` / ``min_half_width`` / ``bank_images``).
        exchange_task_name: the task whose result carries the site's amplitude windows.
        bank_task_name: the task whose data carries the distribution bank.
        max_half_width: the largest window half-width the site lets out or accepts, whatever the job says.
        max_images: the most images whose windows may leave the site, whatever the job says; None: the job's cap.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        exchange_task_name: str = ELCFSTask.AMPLITUDE_SPECTRA,
        bank_task_name: str = ELCFSTask.AMPLITUDE_BANK,
        max_half_width: int = DEFAULT_MAX_HALF_WIDTH,
        max_images: int | None = None,
    ):
        super().__init__(config_file)
        self.exchange_task_name = exchange_task_name
        self.bank_task_name = bank_task_name
        self.max_half_width = max_half_width
        self.max_images = max_images

    def check_for(self, task: str, outgoing: bool) -> Check | None:
        if outgoing and task == self.exchange_task_name:
            return self._check_windows
        if not outgoing and task == self.bank_task_name:
            return self._check_bank
        return None

    def _check_windows(self, dxo: DXO | None, cfg: FedDGConfig) -> str:
        windows = check_amplitude_payload(dxo, amplitude_half_widths(cfg), self.max_half_width,
                                          smallest_cap(cfg.elcfs.bank_images, self.max_images))
        return f"letting out {windows.shape[0]} amplitude windows of {windows.shape[1:]} values"

    def _check_bank(self, dxo: DXO | None, cfg: FedDGConfig) -> None:
        check_amplitude_bank(dxo, amplitude_half_widths(cfg), self.max_half_width, known_sites=cfg.data.train_sites)
