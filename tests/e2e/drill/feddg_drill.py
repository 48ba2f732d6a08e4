"""Test-only components for the POC privacy drill, copied into the drill sites' ``local/custom`` and put on their
allow-list by the drill (never part of the package): an attacking site executor and a server workflow that
records exactly what reaches the server."""

from __future__ import annotations

import json
import os

import numpy as np
from nvflare.apis.controller_spec import Task
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.impl.controller import Controller
from nvflare.apis.shareable import Shareable

ATTACKS = [
    ("amplitude_spectra", "window"),  # the legitimate payload: must arrive
    ("amplitude_spectra", "raw_image"),
    ("amplitude_spectra", "phase"),
    ("amplitude_spectra", "full_spectrum"),
    ("train", "image_as_weight"),
]


def _payload(mode: str, weight_names: list[str]) -> Shareable:
    from feddg.flare.elcfs.payloads import amplitude_window_dxo
    from feddg.methods.frequency import amplitude_window

    image = np.random.default_rng(0).random((4, 1, 32, 32)).astype(np.float32)
    spectrum = np.fft.fftshift(np.fft.fft2(image), axes=(-2, -1))
    meta = {"payload": "amplitude_window", "half_widths": [1, 1], "num_images": 4, "image_size": [32, 32]}
    if mode == "window":
        return amplitude_window_dxo(amplitude_window(image, (1, 1)), (1, 1), (32, 32)).to_shareable()
    if mode == "raw_image":
        return DXO("AMPLITUDE_WINDOW", {"amplitude_window": image}, meta).to_shareable()
    if mode == "phase":
        return DXO("AMPLITUDE_WINDOW", {"amplitude_window": np.angle(spectrum)[..., 15:18, 15:18]
                                        .astype(np.float32)}, meta).to_shareable()
    if mode == "full_spectrum":
        return DXO("AMPLITUDE_WINDOW", {"amplitude_window": np.abs(spectrum).astype(np.float32)},
                   {**meta, "half_widths": [16, 16]}).to_shareable()
    return DXO(DataKind.WEIGHTS, {weight_names[0]: image}).to_shareable()  # an image under a weight's name


class Attacker(Executor):
    """Answers each task with the payload named in the task's ``attack`` header; configures no filter."""

    def execute(self, task_name, shareable, fl_ctx, abort_signal):
        return _payload(shareable.get_header("attack"), shareable.get_header("weight_names") or ["w"])


class AttackRecorder(Controller):
    """Sends every attack to every site and writes what the server received to ``drill_results.json``."""

    def __init__(self, sites: list[str], weight_names: list[str], timeout: int = 120):
        super().__init__()
        self.sites = sites
        self.weight_names = weight_names
        self.timeout = timeout

    def start_controller(self, fl_ctx):
        pass

    def stop_controller(self, fl_ctx):
        pass

    def process_result_of_unknown_task(self, client, task_name, client_task_id, result, fl_ctx):
        pass

    def control_flow(self, abort_signal, fl_ctx):
        records = []
        for task_name, mode in ATTACKS:
            data = Shareable()
            data.set_header("attack", mode)
            data.set_header("weight_names", self.weight_names[:1])
            task = Task(name=task_name, data=data, timeout=self.timeout)
            self.broadcast_and_wait(task, fl_ctx, targets=self.sites, min_responses=len(self.sites),
                                    abort_signal=abort_signal)
            for ct in task.client_tasks:
                result = ct.result
                entry = {"task": task_name, "mode": mode, "site": ct.client.name,
                         "rc": result.get_return_code(ReturnCode.OK) if result is not None else None,
                         "kind": None, "keys": []}
                if result is not None and "DXO" in result:
                    dxo = from_shareable(result)
                    entry.update(kind=str(dxo.data_kind), keys=sorted(map(str, dxo.data)))
                records.append(entry)
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        with open(os.path.join(run_dir, "drill_results.json"), "w") as f:
            json.dump(records, f, indent=2)
