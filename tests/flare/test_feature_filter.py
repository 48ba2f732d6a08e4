"""FeatureMatrixFilter with real Shareables, DXOs and FLContexts: only the declared feature matrix leaves."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.filter import ContentBlockedException
from nvflare.apis.fl_constant import FilterKey, FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from feddg.flare.constants import FedDGTask
from feddg.flare.mla.filter import FeatureMatrixFilter
from feddg.flare.mla.payloads import FEATURE_MATRIX, MLATask, feature_matrix_dxo, feature_request_dxo
from feddg.methods.mla.encoders import build_feature_encoder, encode
from tests.conftest import tiny_experiment
from tests.flare.envelope import assert_envelope_enforced
from tests.flare.fl_context import make_context

WIDTH = 16
RNG = np.random.default_rng(0)
IMAGES = RNG.normal(size=(5, 1, 32, 32)).astype(np.float32)
FEATURES = encode(build_feature_encoder(1, seed=0, width=4, depth=3), IMAGES)  # (5, 16)


def _experiment(**mla) -> dict:
    """The tiny experiment whose random encoder gives WIDTH features per image."""
    exp = tiny_experiment("prostate")
    exp["mla"] = {"encoder_width": 4, "encoder_depth": 3, **mla}
    return exp


@pytest.fixture
def ctx(tmp_path):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", _experiment())
    return fl_ctx


def _run(fl_ctx, shareable, task=MLATask.MLA_FEATURES, direction=FilterKey.OUT, **args):
    fl_ctx.set_prop(FLContextKey.TASK_NAME, task, private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.FILTER_DIRECTION, direction, private=True, sticky=False)
    return FeatureMatrixFilter(**{"max_width": WIDTH, **args}).process(shareable, fl_ctx)


def _valid() -> Shareable:
    return feature_matrix_dxo(FEATURES).to_shareable()


def _declared(x, **meta) -> Shareable:
    """A FEATURE_MATRIX DXO whose meta declares what ``x`` is (so only the content can give it away)."""
    m = {"payload": "feature_matrix", "num_images": int(np.shape(x)[0]),
         "width": int(np.shape(x)[1]) if np.ndim(x) > 1 else 0}
    m.update(meta)
    return DXO(FEATURE_MATRIX, {"features": x}, m).to_shareable()


def test_the_declared_feature_matrix_passes_unchanged(ctx):
    s = _valid()
    assert FEATURES.shape == (5, WIDTH) and FEATURES.dtype == np.float32
    assert _run(ctx, s) is s


ATTACKS = {
    "raw images": lambda: _declared(IMAGES),  # 4-D
    "raw images flattened to rows": lambda: _declared(IMAGES.reshape(5, -1)),  # 1024 values per image
    "one image as a matrix": lambda: _declared(IMAGES[0, 0]),  # (32, 32): wrong width
    "weights kind": lambda: DXO(DataKind.WEIGHTS, {"features": FEATURES}).to_shareable(),
    "extra data key": lambda: DXO(FEATURE_MATRIX, {"features": FEATURES, "image": IMAGES},
                                  {"payload": "feature_matrix", "num_images": 5, "width": WIDTH}).to_shareable(),
    "array in meta": lambda: _declared(FEATURES, thumbnail=IMAGES[0]),
    "unknown meta key": lambda: _declared(FEATURES, patient="x"),
    "NaN": lambda: _declared(FEATURES * np.nan),
    "Inf": lambda: _declared(np.where(np.arange(WIDTH) == 3, np.inf, FEATURES).astype(np.float32)),
    "float64": lambda: _declared(FEATURES.astype(np.float64)),
    "integer dtype": lambda: _declared(np.ones((5, WIDTH), np.int32)),
    "wrong width": lambda: _declared(FEATURES[:, :8]),
    "count mismatch": lambda: _declared(FEATURES, num_images=2),
    "width mismatch": lambda: _declared(FEATURES, width=8),
    "list instead of array": lambda: _declared(FEATURES.tolist()),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_anything_else_is_blocked_with_a_log_line_naming_the_task(ctx, caplog, attack):
    with caplog.at_level(logging.ERROR), pytest.raises(ContentBlockedException):
        _run(ctx, ATTACKS[attack]())
    assert f"task {MLATask.MLA_FEATURES}: blocked the result leaving the site" in caplog.text


def test_the_reasons_are_named(ctx, caplog):
    cases = {
        "raw images flattened to rows": "expected 16 features per image, got 1024",
        "NaN": "NaN/Inf",
        "extra data key": "expected exactly the data key 'features'",
        "count mismatch": "meta num_images 2 differs from the 5 rows sent",
    }
    for attack, reason in cases.items():
        caplog.clear()
        with caplog.at_level(logging.ERROR), pytest.raises(ContentBlockedException, match=reason):
            _run(ctx, ATTACKS[attack]())
        assert reason in caplog.text


def test_extra_top_level_keys_and_arrays_in_headers_are_blocked(ctx):
    assert_envelope_enforced(lambda s: _run(ctx, s), _valid)


def test_the_width_comes_from_the_job_and_the_caps_from_job_and_site(ctx, tmp_path):
    """The job's feddg.yaml fixes the width (the encoder's) and may cap the rows (mla.feature_images); the site's
    own caps (privacy.json arguments) apply on top, the smaller row cap wins."""
    with pytest.raises(ContentBlockedException, match="5 rows is more than the allowed 3"):
        _run(ctx, _valid(), max_rows=3)
    capped, _ = make_context(tmp_path / "capped", "BIDMC", _experiment(feature_images=4))
    with pytest.raises(ContentBlockedException, match="5 rows is more than the allowed 4"):
        _run(capped, _valid(), max_rows=10)
    wider, _ = make_context(tmp_path / "wider", "BIDMC", _experiment(encoder_width=32))  # 128 features
    wide = _declared(np.zeros((5, 128), np.float32))
    with pytest.raises(ContentBlockedException, match="128 features per image exceed the allowed 64"):
        _run(wider, wide, max_width=64)
    assert _run(wider, wide, max_width=128) is not None
    assert _run(ctx, _valid(), max_width=64, max_rows=10) is not None


def test_other_tasks_incoming_data_and_error_replies_pass(ctx):
    weights = DXO(DataKind.WEIGHTS, {"w": IMAGES}).to_shareable()
    assert _run(ctx, weights, task=FedDGTask.TRAIN) is weights  # not this filter's task
    request = feature_request_dxo("random", None, in_channels=1, seed=0, width=4, depth=3).to_shareable()
    assert _run(ctx, request, direction=FilterKey.IN) is request  # the request comes in, it is not guarded here
    error = make_reply(ReturnCode.EXECUTION_EXCEPTION)
    assert _run(ctx, error) is error


def test_without_a_direction_the_filter_refuses_to_guess(ctx):
    ctx.set_prop(FLContextKey.TASK_NAME, MLATask.MLA_FEATURES, private=True, sticky=False)
    with pytest.raises(ContentBlockedException, match="cannot tell"):
        FeatureMatrixFilter().process(_valid(), ctx)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_width"):
        FeatureMatrixFilter(max_width=0)
    with pytest.raises(ValueError, match="max_rows"):
        FeatureMatrixFilter(max_rows=0)
