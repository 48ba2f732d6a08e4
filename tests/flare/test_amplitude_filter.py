"""AmplitudeWindowFilter with real Shareables, DXOs and FLContexts: only the declared window payload leaves."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.filter import ContentBlockedException
from nvflare.apis.fl_constant import FilterKey, FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from feddg.flare.constants import FedDGTask
from feddg.flare.elcfs.filter import AmplitudeWindowFilter
from feddg.flare.elcfs.payloads import ELCFSTask, amplitude_bank_dxo, amplitude_window_dxo
from feddg.methods.frequency import amplitude_window
from tests.conftest import tiny_experiment
from tests.flare.envelope import assert_envelope_enforced
from tests.flare.fl_context import make_context

HW = (1, 1)
RNG = np.random.default_rng(0)
IMAGES = RNG.normal(size=(5, 1, 32, 32)).astype(np.float32)


@pytest.fixture
def ctx(tmp_path):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", tiny_experiment("prostate"))
    return fl_ctx


def _run(fl_ctx, shareable, task=ELCFSTask.AMPLITUDE_SPECTRA, direction=FilterKey.OUT, **args):
    fl_ctx.set_prop(FLContextKey.TASK_NAME, task, private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.FILTER_DIRECTION, direction, private=True, sticky=False)
    return AmplitudeWindowFilter(**{"max_half_width": 1, **args}).process(shareable, fl_ctx)


def _valid() -> Shareable:
    return amplitude_window_dxo(amplitude_window(IMAGES, HW), HW, (32, 32)).to_shareable()


def test_the_declared_window_payload_passes_unchanged(ctx):
    s = _valid()
    assert _run(ctx, s) is s


def _spectrum(images):
    return np.fft.fftshift(np.fft.fft2(images), axes=(-2, -1))


def _with_meta(windows, **meta):
    dxo = amplitude_window_dxo(windows, HW, (32, 32))
    dxo.meta.update(meta)
    return dxo.to_shareable()


ATTACKS = {
    "raw image": lambda: DXO("AMPLITUDE_WINDOW", {"amplitude_window": IMAGES},
                             {"payload": "amplitude_window", "half_widths": [1, 1], "num_images": 5}).to_shareable(),
    "raw image as window": lambda: _with_meta(IMAGES[:, :, :3, :3]),  # negative values give it away
    "phase": lambda: DXO("AMPLITUDE_WINDOW", {"amplitude_window": np.angle(_spectrum(IMAGES))[..., 15:18, 15:18]
                                              .astype(np.float32)},
                         {"payload": "amplitude_window", "half_widths": [1, 1], "num_images": 5}).to_shareable(),
    "full spectrum": lambda: DXO("AMPLITUDE_WINDOW", {"amplitude_window": np.abs(_spectrum(IMAGES)).astype(np.float32)},
                                 {"payload": "amplitude_window", "half_widths": [1, 1], "num_images": 5}).to_shareable(),
    "full spectrum declared as such": lambda: DXO(
        "AMPLITUDE_WINDOW", {"amplitude_window": np.abs(_spectrum(IMAGES[..., :31, :31])).astype(np.float32)},
        {"payload": "amplitude_window", "half_widths": [15, 15], "num_images": 5}).to_shareable(),
    "weights kind": lambda: DXO(DataKind.WEIGHTS, {"amplitude_window": amplitude_window(IMAGES, HW)}).to_shareable(),
    "extra data key": lambda: DXO("AMPLITUDE_WINDOW", {"amplitude_window": amplitude_window(IMAGES, HW),
                                                       "image": IMAGES},
                                  {"payload": "amplitude_window", "half_widths": [1, 1], "num_images": 5}
                                  ).to_shareable(),
    "array in meta": lambda: _with_meta(amplitude_window(IMAGES, HW), thumbnail=IMAGES[0]),
    "unknown meta key": lambda: _with_meta(amplitude_window(IMAGES, HW), patient="x"),
    "NaN": lambda: _with_meta(amplitude_window(IMAGES, HW) * np.nan),
    "integer dtype": lambda: DXO("AMPLITUDE_WINDOW", {"amplitude_window": np.ones((5, 1, 3, 3), np.int32)},
                                 {"payload": "amplitude_window", "half_widths": [1, 1], "num_images": 5}
                                 ).to_shareable(),
    "count mismatch": lambda: _with_meta(amplitude_window(IMAGES, HW), num_images=2),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_anything_else_is_blocked_with_a_log_line_naming_the_task(ctx, caplog, attack):
    with caplog.at_level(logging.ERROR), pytest.raises(ContentBlockedException):
        _run(ctx, ATTACKS[attack]())
    assert f"task {ELCFSTask.AMPLITUDE_SPECTRA}: blocked the result leaving the site" in caplog.text


def test_extra_top_level_keys_and_arrays_in_headers_are_blocked(ctx):
    assert_envelope_enforced(lambda s: _run(ctx, s), _valid)


def test_the_window_comes_from_the_job_and_the_caps_from_job_and_site(ctx, tmp_path):
    """The job's feddg.yaml fixes the window exactly (32 px, alpha 0.01, floor 1: 3 x 3) and may cap the images;
    the site's own caps (privacy.json arguments) apply on top, the smaller cap wins."""
    wider = amplitude_window_dxo(amplitude_window(IMAGES, (2, 2)), (2, 2), (32, 32)).to_shareable()
    with pytest.raises(ContentBlockedException, match=r"half-widths \[2, 2\] differ from the configured"):
        _run(ctx, wider, max_half_width=4)
    with pytest.raises(ContentBlockedException, match=r"half-widths \[1, 1\] exceed the allowed 0"):
        _run(ctx, _valid(), max_half_width=0)
    with pytest.raises(ContentBlockedException, match="5 images exceed the allowed 3"):
        _run(ctx, _valid(), max_images=3)
    exp = tiny_experiment("prostate")
    exp["elcfs"] = {"bank_images": 4}
    capped, _ = make_context(tmp_path / "capped", "BIDMC", exp)
    with pytest.raises(ContentBlockedException, match="5 images exceed the allowed 4"):
        _run(capped, _valid(), max_images=10)
    assert _run(ctx, _valid(), max_half_width=4, max_images=10) is not None


def test_other_tasks_incoming_data_and_error_replies_pass(ctx):
    weights = DXO(DataKind.WEIGHTS, {"w": IMAGES}).to_shareable()
    assert _run(ctx, weights, task=FedDGTask.TRAIN) is weights  # not this filter's task
    request = Shareable()
    assert _run(ctx, request, direction=FilterKey.IN) is request  # the exchange request carries nothing
    error = make_reply(ReturnCode.EXECUTION_EXCEPTION)
    assert _run(ctx, error) is error


def test_incoming_bank_is_validated(ctx):
    good = amplitude_bank_dxo({"BMC": amplitude_window(IMAGES, HW)}, HW).to_shareable()
    assert _run(ctx, good, task=ELCFSTask.AMPLITUDE_BANK, direction=FilterKey.IN) is good
    bad = amplitude_bank_dxo({"BMC": amplitude_window(IMAGES, HW)[..., :2]}, HW).to_shareable()
    with pytest.raises(ContentBlockedException, match="task amplitude_bank: bank entry 'BMC'"):
        _run(ctx, bad, task=ELCFSTask.AMPLITUDE_BANK, direction=FilterKey.IN)
    nan = amplitude_bank_dxo({"BMC": amplitude_window(IMAGES, HW) * np.inf}, HW).to_shareable()
    with pytest.raises(ContentBlockedException, match="NaN or infinite"):
        _run(ctx, nan, task=ELCFSTask.AMPLITUDE_BANK, direction=FilterKey.IN)


def test_without_a_direction_the_filter_refuses_to_guess(ctx):
    ctx.set_prop(FLContextKey.TASK_NAME, ELCFSTask.AMPLITUDE_SPECTRA, private=True, sticky=False)
    with pytest.raises(ContentBlockedException, match="cannot tell"):
        AmplitudeWindowFilter().process(_valid(), ctx)
