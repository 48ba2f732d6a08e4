"""ELCFS's amplitude exchange: a server workflow that runs once, before the federated rounds.

List it in ``workflows`` before :class:`feddg.flare.controller.LeaveOneSiteOutFedAvg`:

1. ``amplitude_spectra`` to every training site (the unseen site takes no part). Task data: empty. Result (DXO
   ``AMPLITUDE_WINDOW``): the centred low-frequency amplitude window of each contributed training image,
   (N, C, 2 b_h + 1, 2 b_w + 1) floats; never a phase, never a full spectrum.
2. The server checks each result against the job's window
   (:func:`feddg.flare.elcfs.payloads.check_amplitude_payload`) and builds the distribution bank A = [A^1, ..., A^K]
   of the sites that answered with valid windows. A site that sent nothing valid is left out with a warning. With
   fewer than two sites in the bank ELCFS cannot transfer any distribution, and the job stops here with a message
   that says so.
3. ``amplitude_bank`` to every training site. Task data (DXO ``AMPLITUDE_BANK``): {site: windows}. Each site keeps
   the other sites' entries in its workspace (:class:`feddg.flare.elcfs.executor.ELCFSExecutor`) and acknowledges.

The server keeps nothing of the bank after sending it.
"""

from __future__ import annotations

from nvflare.apis.controller_spec import ClientTask, Task
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal

from feddg.flare.constants import CONFIG_FILE
from feddg.flare.elcfs.payloads import ELCFSTask, amplitude_bank_dxo, amplitude_half_widths, check_amplitude_payload
from feddg.flare.payloads import PayloadRejected
from feddg.flare.phase import ServerPhase


class AmplitudeExchange(ServerPhase):
    """Collect the training sites' amplitude windows into the distribution bank and hand it to every training site.

    Args:
        config_file: the job's ``feddg.yaml`` (training sites, image size, ``elcfs.alpha`` / ``min_half_width`` /
            ``bank_images``, and ``elcfs.exchange_timeout``: the seconds each of the two tasks waits for the sites).
        exchange_task_name: the task that asks for the amplitude windows.
        bank_task_name: the task that delivers the bank.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        exchange_task_name: str = ELCFSTask.AMPLITUDE_SPECTRA,
        bank_task_name: str = ELCFSTask.AMPLITUDE_BANK,
    ):
        super().__init__(config_file)
        self.exchange_task_name = exchange_task_name
        self.bank_task_name = bank_task_name

    def control_flow(self, abort_signal: Signal, fl_ctx: FLContext) -> None:
        cfg = self._cfg
        sites = cfg.data.train_sites
        if len(sites) < 2:
            self.system_panic(f"ELCFS needs at least two training sites to exchange amplitude spectra; the job has "
                              f"{sites} (data.sites minus the unseen site {cfg.data.unseen_site})", fl_ctx)
            return
        hw = amplitude_half_widths(cfg)
        self.log_info(fl_ctx, f"amplitude exchange: asking {sites} for {2 * hw[0] + 1}x{2 * hw[1] + 1} amplitude "
                              f"windows per channel and image")
        ask = Task(name=self.exchange_task_name, data=Shareable(), timeout=cfg.elcfs.exchange_timeout)
        self.broadcast_and_wait(ask, fl_ctx, targets=sites, min_responses=len(sites), abort_signal=abort_signal)
        if abort_signal.triggered:
            return
        bank = {}
        for client_task in ask.client_tasks:
            site, windows = self._accept(client_task, hw, fl_ctx)
            if windows is not None:
                bank[site] = windows
        for site in sorted(set(sites) - set(bank)):
            self.log_warning(fl_ctx, f"amplitude exchange: site {site} contributed no amplitude spectra; it is left "
                                     f"out of the distribution bank")
        if len(bank) < 2:
            self.system_panic(f"amplitude exchange: only {sorted(bank)} contributed amplitude spectra; ELCFS needs at "
                              f"least two sites in the distribution bank. Stopping before training.", fl_ctx)
            return
        summary = ", ".join(f"{s} {len(a)}" for s, a in sorted(bank.items()))
        self.log_info(fl_ctx, f"amplitude exchange: distribution bank of {len(bank)} sites (images: {summary})")
        deliver = Task(name=self.bank_task_name, data=amplitude_bank_dxo(bank, hw).to_shareable(),
                       timeout=cfg.elcfs.exchange_timeout)
        self.broadcast_and_wait(deliver, fl_ctx, targets=sites, min_responses=len(sites), abort_signal=abort_signal)
        for client_task in deliver.client_tasks:
            rc = client_task.result.get_return_code(ReturnCode.OK) if client_task.result is not None else "no answer"
            if rc != ReturnCode.OK:
                self.log_warning(fl_ctx, f"amplitude exchange: site {client_task.client.name} did not store the bank "
                                         f"({rc}); it cannot train with ELCFS")

    def _accept(self, client_task: ClientTask, hw: tuple[int, int], fl_ctx: FLContext):
        site = client_task.client.name
        result = client_task.result
        if result is None:
            self.log_warning(fl_ctx, f"amplitude exchange: no answer from {site}")
            return site, None
        rc = result.get_return_code(ReturnCode.OK)
        if rc != ReturnCode.OK:
            self.log_warning(fl_ctx, f"amplitude exchange: {site} answered with {rc}")
            return site, None
        try:
            windows = check_amplitude_payload(from_shareable(result), hw, max(hw), self._cfg.elcfs.bank_images)
        except (PayloadRejected, ValueError) as e:
            self.log_warning(fl_ctx, f"amplitude exchange: rejected the windows of {site}: {e}")
            return site, None
        if len(windows) == 0:
            return site, None
        return site, windows
