"""SiteEgressFilter with real Shareables, DXOs and FLContexts: every result must be a payload kind the project
knows; a raw image never leaves, whatever task it hides in."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind, MetaKey
from nvflare.apis.filter import ContentBlockedException
from nvflare.apis.fl_constant import FilterKey, FLContextKey, ReturnCode
from nvflare.apis.shareable import make_reply

from feddg.experiment import experiment_from_dict
from feddg.flare.constants import FedDGMeta, FedDGTask
from feddg.flare.egress_filter import SiteEgressFilter
from feddg.flare.ga.part import GENERALIZATION_GAP
from feddg.flare.elcfs.payloads import ELCFSTask, amplitude_window_dxo
from feddg.methods.frequency import amplitude_window
from feddg.nets.unet import build_model
from tests.conftest import tiny_experiment
from tests.flare.envelope import assert_envelope_enforced
from tests.flare.fl_context import make_context

IMAGE = np.random.default_rng(0).normal(size=(1, 1, 32, 32)).astype(np.float32)


@pytest.fixture
def setup(tmp_path):
    exp = tiny_experiment("prostate")
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    weights = {k: v.numpy() for k, v in build_model(experiment_from_dict(exp)).state_dict().items()}
    return fl_ctx, weights


def _run(fl_ctx, shareable, task, direction=FilterKey.OUT, **args):
    fl_ctx.set_prop(FLContextKey.TASK_NAME, task, private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.FILTER_DIRECTION, direction, private=True, sticky=False)
    return SiteEgressFilter(**args).process(shareable, fl_ctx)


def _train_result(weights, kind=DataKind.WEIGHTS, **meta):
    return DXO(kind, data=weights, meta={FedDGMeta.NUM_TRAIN_SAMPLES: 40, FedDGMeta.VAL_DICE: 0.5,
                                         MetaKey.NUM_STEPS_CURRENT_ROUND: 10, **meta}).to_shareable()


METRICS = {"val": {"prostate": {"dice": {"mean": 0.7, "std": 0.1}, "hd95": {"mean": float("nan")}},
                   "loss": 0.3, "n_images": 2, "unit": "mm"}}


def test_the_project_payloads_pass(setup):
    fl_ctx, weights = setup
    for kind in (DataKind.WEIGHTS, DataKind.WEIGHT_DIFF):
        s = _train_result(weights, kind, **{GENERALIZATION_GAP: 0.01})
        assert _run(fl_ctx, s, FedDGTask.TRAIN) is s
    metrics = DXO(DataKind.METRICS, METRICS, {FedDGMeta.MODEL_NAME: "final"}).to_shareable()
    assert _run(fl_ctx, metrics, FedDGTask.EVALUATE) is metrics
    window = amplitude_window_dxo(amplitude_window(IMAGE, (1, 1)), (1, 1), (32, 32)).to_shareable()
    assert _run(fl_ctx, window, ELCFSTask.AMPLITUDE_SPECTRA) is window
    for task in (ELCFSTask.AMPLITUDE_BANK, "anything"):
        ack = make_reply(ReturnCode.OK)
        assert _run(fl_ctx, ack, task) is ack  # nothing in it
    incoming = DXO(DataKind.WEIGHTS, {"x": IMAGE}).to_shareable()
    assert _run(fl_ctx, incoming, FedDGTask.TRAIN, direction=FilterKey.IN) is incoming


def _attacks(weights):
    key = next(iter(weights))
    return {
        "extra key": (FedDGTask.TRAIN, _train_result({**weights, "image": IMAGE})),
        "image as a weight": (FedDGTask.TRAIN, _train_result({**weights, key: IMAGE})),
        "NaN weights": (FedDGTask.TRAIN, _train_result({k: v * np.nan if v.dtype.kind == "f" else v
                                                        for k, v in weights.items()})),
        "array in meta": (FedDGTask.TRAIN, _train_result(weights, thumbnail=IMAGE)),
        "unknown meta": (FedDGTask.TRAIN, _train_result(weights, patient_id="x")),
        "metrics as training result": (FedDGTask.TRAIN, DXO(DataKind.METRICS, METRICS).to_shareable()),
        "array in metrics": (FedDGTask.EVALUATE, DXO(DataKind.METRICS, {"val": {"map": IMAGE}}).to_shareable()),
        "raw image on the exchange": (ELCFSTask.AMPLITUDE_SPECTRA,
                                      DXO("AMPLITUDE_WINDOW", {"amplitude_window": IMAGE},
                                          {"payload": "amplitude_window", "half_widths": [1, 1],
                                           "num_images": 1}).to_shareable()),
        "full spectrum on the exchange": (ELCFSTask.AMPLITUDE_SPECTRA, amplitude_window_dxo(
            amplitude_window(IMAGE[..., :31, :31], (15, 15)), (15, 15), (31, 31)).to_shareable()),
        "payload on an acknowledgement": (ELCFSTask.AMPLITUDE_BANK,
                                          DXO(DataKind.WEIGHTS, {"x": IMAGE}).to_shareable()),
        "unknown task": ("exfiltrate", DXO(DataKind.WEIGHTS, weights).to_shareable()),
    }


def test_everything_else_is_blocked_with_a_log_line(setup, caplog):
    fl_ctx, weights = setup
    for name, (task, shareable) in _attacks(weights).items():
        caplog.clear()
        with caplog.at_level(logging.ERROR), pytest.raises(ContentBlockedException):
            _run(fl_ctx, shareable, task)
        assert f"site policy: task {task}: blocked the result leaving the site" in caplog.text, name


def test_extra_top_level_keys_and_arrays_in_headers_are_blocked(setup):
    fl_ctx, weights = setup
    assert_envelope_enforced(lambda s: _run(fl_ctx, s, FedDGTask.TRAIN), lambda: _train_result(weights))


def test_parameter_budget(setup):
    fl_ctx, weights = setup
    with pytest.raises(ContentBlockedException, match="exceed the site's limit of 10 parameters"):
        _run(fl_ctx, _train_result(weights), FedDGTask.TRAIN, max_parameters=10)
