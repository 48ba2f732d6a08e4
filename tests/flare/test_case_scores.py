"""Per-case scores in the evaluate result: built from the evaluation without case ids, checked by one contract that
the site's egress filter applies, and left out when the site says so."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_constant import FilterKey, FLContextKey

from feddg.data.dataset import SliceSet
from feddg.evaluation import evaluate_sliceset
from feddg.flare.constants import FedDGMeta, FedDGTask
from feddg.flare.egress_filter import SiteEgressFilter
from feddg.flare.payloads import CASES, PayloadRejected, check_evaluate_result, with_case_scores
from feddg.nets.unet import FedDGUNet
from tests.conftest import tiny_experiment
from tests.flare.fl_context import make_context


def _evaluated(names=("disc", "cup")):
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:32, :32]
    labels = np.stack([np.stack([np.hypot(yy - 16, xx - 16) < r + i for r in (9, 4)[:len(names)]])
                       for i in range(4)]).astype(np.uint8)
    s = SliceSet("S", rng.normal(size=(4, 1, 32, 32)).astype(np.float32), labels,
                 ["train/patient_007.png", "train/b.png", "test/c.png", "test/d.png"], np.zeros(4, np.int64), None)
    torch.manual_seed(0)
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4), out_channels=len(names))
    return evaluate_sliceset(model, s, list(names), torch.device("cpu"), 2)


def test_per_case_scores_are_the_evaluations_numbers_by_anonymous_index():
    result = _evaluated()
    summary = with_case_scores(result, ["disc", "cup"], share=True)
    cases = summary[CASES]
    assert list(cases) == ["0", "1", "2", "3"]
    for i, case in enumerate(result["cases"]):
        for l, name in enumerate(("disc", "cup")):
            assert cases[str(i)][name] == {m: case[str(l)][m] for m in ("dice", "hd95", "asd")}
    assert "patient_007" not in repr(summary) and "case_id" not in repr(summary) and "empty" not in repr(cases)
    assert np.mean([c["disc"]["dice"] for c in cases.values()]) == pytest.approx(summary["disc"]["dice"]["mean"])
    check_evaluate_result(DXO(DataKind.METRICS, {"test": summary}))
    assert CASES not in with_case_scores(result, ["disc", "cup"], share=False)


@pytest.mark.parametrize("change, reason", [
    (lambda c: c.update({"patient_007": c.pop("0")}), "indices 0..n-1"),
    (lambda c: c.pop("3"), "3 per-case scores for 4 cases"),
    (lambda c: c["0"]["disc"].update(empty="pred"), "expected exactly"),
    (lambda c: c["1"]["cup"].update(dice=float("nan")), "finite numbers"),
    (lambda c: c["2"]["cup"].update(asd="far"), "finite numbers"),
    (lambda c: c["2"].pop("cup"), "expected the structures"),
])
def test_malformed_per_case_scores_are_refused_by_the_contract(change, reason):
    summary = with_case_scores(_evaluated(), ["disc", "cup"], share=True)
    bad = copy.deepcopy(summary)
    change(bad[CASES])
    with pytest.raises(PayloadRejected, match=reason):
        check_evaluate_result(DXO(DataKind.METRICS, {"test": bad}))


def test_the_site_egress_filter_lets_per_case_scores_out(tmp_path):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", tiny_experiment("prostate"))
    fl_ctx.set_prop(FLContextKey.TASK_NAME, FedDGTask.EVALUATE, private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.FILTER_DIRECTION, FilterKey.OUT, private=True, sticky=False)
    summary = with_case_scores(_evaluated(("prostate",)), ["prostate"], share=True)
    ok = DXO(DataKind.METRICS, {"test": summary}, {FedDGMeta.MODEL_NAME: "final"}).to_shareable()
    assert SiteEgressFilter().process(ok, fl_ctx) is ok
    bad = copy.deepcopy(summary)
    bad[CASES]["0"]["prostate"]["case_id"] = 7
    from nvflare.apis.filter import ContentBlockedException

    with pytest.raises(ContentBlockedException):
        SiteEgressFilter().process(DXO(DataKind.METRICS, {"test": bad}).to_shareable(), fl_ctx)
