"""ELCFS's NVFlare pieces with real Shareables, DXOs and FLContexts: the site executor's exchange tasks, the
server's exchange workflow with every site's executor and filter in the loop, and episodic local training."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal

from feddg.experiment import experiment_from_dict
from feddg.flare.constants import FedDGMeta, FedDGTask
from feddg.flare.elcfs.exchange import AmplitudeExchange
from feddg.flare.elcfs.executor import BANK_FILE, ELCFSExecutor
from feddg.flare.elcfs.filter import AmplitudeWindowFilter
from feddg.flare.elcfs.payloads import AMPLITUDE_WINDOW, ELCFSTask, amplitude_bank_dxo, check_amplitude_payload
from feddg.flare.executor import STATE_DIR
from feddg.nets.unet import build_model
from tests.conftest import tiny_experiment
from tests.flare.federation import Federation
from tests.flare.fl_context import make_context

TRAIN_SITES = ["BIDMC", "BMC", "HK", "I2CVB", "UCL"]


@pytest.fixture
def exp(synthetic_root):
    e = tiny_experiment("prostate", root=str(synthetic_root["prostate"]))
    e["elcfs"] = {"boundary_weight": 0.5}
    return e


def _windows(tmp_path, site, exp):
    fl_ctx, _ = make_context(tmp_path, site, exp)
    return ELCFSExecutor().execute(ELCFSTask.AMPLITUDE_SPECTRA, Shareable(), fl_ctx, Signal()), fl_ctx


def test_a_site_sends_its_training_images_amplitude_windows_only(tmp_path, exp):
    result, _ = _windows(tmp_path, "BIDMC", exp)
    dxo = from_shareable(result)
    windows = check_amplitude_payload(dxo, (1, 1), 1)  # 32 px, alpha 0.01: floored to a 3 x 3 window
    assert dxo.data_kind == AMPLITUDE_WINDOW and windows.shape[1:] == (1, 3, 3)
    from feddg.data.dataset import load_site
    assert windows.shape[0] == len(load_site(experiment_from_dict(exp).data, "BIDMC")["train"])


def test_the_job_and_the_site_can_cap_the_contributed_images(tmp_path, exp):
    exp["elcfs"]["bank_images"] = 3
    result, _ = _windows(tmp_path / "job", "BIDMC", exp)
    assert from_shareable(result).data["amplitude_window"].shape[0] == 3
    fl_ctx, _ = make_context(tmp_path / "site", "BIDMC", exp)
    local = fl_ctx.get_engine().get_workspace().get_site_config_dir()
    with open(f"{local}/feddg_site.json", "w") as f:
        json.dump({"amplitude_bank_images": 1}, f)
    result = ELCFSExecutor().execute(ELCFSTask.AMPLITUDE_SPECTRA, Shareable(), fl_ctx, Signal())
    assert from_shareable(result).data["amplitude_window"].shape[0] == 1  # the smaller cap wins
    with open(f"{local}/feddg_site.json", "w") as f:
        json.dump({"amplitude_bank_imgs": 2}, f)
    result = ELCFSExecutor().execute(ELCFSTask.AMPLITUDE_SPECTRA, Shareable(), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION  # a typo in the site file is an error


def test_the_unseen_site_takes_no_part(tmp_path, exp, caplog):
    with caplog.at_level(logging.ERROR):
        result, _ = _windows(tmp_path, "RUNMC", exp)
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    assert "unseen site" in caplog.text


def _bank(**entries):
    return amplitude_bank_dxo(entries, (1, 1)).to_shareable()


def test_bank_is_stored_without_the_own_entry_and_bad_banks_are_refused(tmp_path, exp, caplog):
    fl_ctx, run_dir = make_context(tmp_path, "BIDMC", exp)
    w = np.ones((4, 1, 3, 3), np.float32)
    ok = ELCFSExecutor().execute(ELCFSTask.AMPLITUDE_BANK, _bank(BIDMC=w, BMC=w * 2, HK=w * 3), fl_ctx, Signal())
    assert ok.get_return_code() == ReturnCode.OK
    with np.load(run_dir / STATE_DIR / BANK_FILE) as f:
        assert sorted(f.files) == ["BMC", "HK"] and float(f["HK"].max()) == 3.0
    cases = {
        "unknown sites ['Mallory']": _bank(BMC=w, Mallory=w),
        "shape (4, 1, 3, 2)": _bank(BMC=w[..., :2]),
        "NaN or infinite": _bank(BMC=w * np.nan),
        "no other site's spectra": _bank(BIDMC=w),
        "channel": _bank(BMC=np.ones((4, 3, 3, 3), np.float32)),
    }
    for reason, bank in cases.items():
        with caplog.at_level(logging.ERROR):
            caplog.clear()
            result = ELCFSExecutor().execute(ELCFSTask.AMPLITUDE_BANK, bank, fl_ctx, Signal())
        assert result.get_return_code() == ReturnCode.BAD_TASK_DATA, reason
        assert reason in caplog.text


def _train_task(exp, current_round=0):
    weights = {k: v.numpy() for k, v in build_model(experiment_from_dict(exp)).state_dict().items()}
    s = DXO(DataKind.WEIGHTS, data=weights).to_shareable()
    s.set_header("current_round", current_round)
    return s


def test_training_needs_the_bank_and_then_runs_episodic_steps(tmp_path, exp, caplog):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    with caplog.at_level(logging.ERROR):
        result = ELCFSExecutor().execute(FedDGTask.TRAIN, _train_task(exp), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    assert "no amplitude bank in the workspace" in caplog.text
    bank = {s: from_shareable(_windows(tmp_path / s, s, exp)[0]).data["amplitude_window"] for s in ("BMC", "HK")}
    assert ELCFSExecutor().execute(ELCFSTask.AMPLITUDE_BANK, amplitude_bank_dxo(bank, (1, 1)).to_shareable(),
                                   fl_ctx, Signal()).get_return_code() == ReturnCode.OK
    result = ELCFSExecutor().execute(FedDGTask.TRAIN, _train_task(exp), fl_ctx, Signal())  # a fresh process
    assert result.get_return_code(ReturnCode.OK) == ReturnCode.OK
    dxo = from_shareable(result)
    assert dxo.data_kind == DataKind.WEIGHTS and np.isfinite(dxo.meta[FedDGMeta.TRAIN_LOSS])


# ---------------------------------------------------------------------- the server workflow
def _federation(tmp_path, exp, tamper=None) -> Federation:
    """The training sites' real executors, each behind its AmplitudeWindowFilter both ways."""
    return Federation({s: make_context(tmp_path / s, s, exp)[0] for s in TRAIN_SITES}, ELCFSExecutor,
                      in_filters=lambda: [AmplitudeWindowFilter(max_half_width=1)],
                      out_filters=lambda: [AmplitudeWindowFilter(max_half_width=1)],
                      tampered_task=ELCFSTask.AMPLITUDE_SPECTRA, tamper=tamper)


def _workflow(tmp_path, exp, federation):
    fl_ctx, _ = make_context(tmp_path / "server", "server", exp)
    wf = AmplitudeExchange()
    wf.start_controller(fl_ctx)
    wf.broadcast_and_wait = federation.broadcast_and_wait
    wf.panics = []
    wf.system_panic = lambda reason, _ctx: wf.panics.append(reason)
    return wf, fl_ctx


def test_exchange_builds_the_bank_and_every_training_site_stores_the_others(tmp_path, exp):
    fed = _federation(tmp_path, exp)
    wf, fl_ctx = _workflow(tmp_path, exp, fed)
    wf.control_flow(Signal(), fl_ctx)
    assert wf.panics == []
    assert fed.targets == [(ELCFSTask.AMPLITUDE_SPECTRA, TRAIN_SITES),  # the unseen site RUNMC is never asked
                           (ELCFSTask.AMPLITUDE_BANK, TRAIN_SITES)]
    for site, ctx in fed.sites.items():
        run_dir = ctx.get_engine().get_workspace().get_run_dir(ctx.get_job_id())
        with np.load(f"{run_dir}/{STATE_DIR}/{BANK_FILE}") as f:
            assert sorted(f.files) == sorted(set(TRAIN_SITES) - {site})


def test_a_site_whose_result_is_blocked_is_left_out_with_a_warning(tmp_path, exp, caplog):
    def send_raw_images(result):
        dxo = from_shareable(result)
        dxo.data["amplitude_window"] = np.random.default_rng(0).normal(size=(3, 1, 32, 32)).astype(np.float32)
        return dxo.to_shareable()

    fed = _federation(tmp_path, exp, tamper={"HK": send_raw_images})
    wf, fl_ctx = _workflow(tmp_path, exp, fed)
    with caplog.at_level(logging.WARNING):
        wf.control_flow(Signal(), fl_ctx)
    assert wf.panics == []
    assert "site HK contributed no amplitude spectra; it is left out" in caplog.text
    ctx = fed.sites["BIDMC"]
    with np.load(f"{ctx.get_engine().get_workspace().get_run_dir('job1')}/{STATE_DIR}/{BANK_FILE}") as f:
        assert sorted(f.files) == ["BMC", "I2CVB", "UCL"]


def test_fewer_than_two_contributing_sites_stop_the_job_before_training(tmp_path, exp):
    blocked = {s: (lambda r: DXO(DataKind.WEIGHTS, {"w": np.zeros(1)}).to_shareable()) for s in TRAIN_SITES[1:]}
    fed = _federation(tmp_path, exp, tamper=blocked)
    wf, fl_ctx = _workflow(tmp_path, exp, fed)
    wf.control_flow(Signal(), fl_ctx)
    assert len(wf.panics) == 1 and "only ['BIDMC'] contributed" in wf.panics[0]
    assert len(fed.targets) == 1  # the bank is never sent


def test_a_job_with_one_training_site_stops_with_a_clear_message(tmp_path, exp):
    exp["data"]["sites"] = ["BIDMC", "RUNMC"]
    fed = _federation(tmp_path, exp)
    wf, fl_ctx = _workflow(tmp_path, exp, fed)
    wf.control_flow(Signal(), fl_ctx)
    assert "at least two training sites" in wf.panics[0] and fed.targets == []
