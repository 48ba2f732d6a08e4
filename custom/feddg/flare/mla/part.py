"""MLA's part of a job: the server keeps the final round's local models of the sites that opt in (the
``local_model_keeper`` component the rounds' workflow hands them to), the MLA workflow after the rounds, the MLA
executor, the job filter on the feature task, what a site's egress filter lets out, the ``mla`` section of
feddg.yaml (written out in full so that a job copy can switch to ``encoder: global`` and the like), and the opt-in
that ``feddg simulate`` writes for its own sites."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from feddg.config import FedDGConfig
from feddg.experiment import Section
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.method_spec import Component, MethodPart, SavedModel, SiteLimit, TaskFilter
from feddg.flare.mla.names import DEFAULT_MAX_FEATURE_WIDTH, SHARE_LOCAL_MODEL, MLATask
from feddg.flare.mla.settings import MLASettings
from feddg.report import REPORT_FILE

if TYPE_CHECKING:
    from nvflare.apis.dxo import DXO


KEEPER_ID = "local_model_keeper"


def egress_feature_matrix(dxo: DXO, cfg: FedDGConfig, limits: Mapping[str, Any]) -> None:
    """A site lets out a feature matrix within its own caps."""
    from feddg.flare.mla.payloads import check_feature_payload  # torch: only where a site checks a payload

    check_feature_payload(dxo, None, limits["max_feature_width"], limits["max_feature_rows"])


def egress_mla_evaluation(dxo: DXO, cfg: FedDGConfig, limits: Mapping[str, Any]) -> None:
    from feddg.flare.mla.payloads import check_mla_evaluate_result

    check_mla_evaluate_result(dxo)


PART = MethodPart(
    name="mla",
    executor="feddg.flare.mla.executor.MLAExecutor",
    tasks=(MLATask.MLA_FEATURES, MLATask.MLA_EVALUATE),
    server_components=(Component("feddg.flare.mla.local_models.LocalModelKeeper", {}, id=KEEPER_ID),),
    round_args={"final_round_receiver_id": KEEPER_ID},
    after_rounds=(Component("feddg.flare.mla.workflow.MLAWorkflow",
                            {"config_file": CONFIG_FILE, "persistor_id": "persistor",
                             "report_file": REPORT_FILE}, id="mla"),),
    result_filters=(TaskFilter((MLATask.MLA_FEATURES,),
                               Component("feddg.flare.mla.filter.FeatureMatrixFilter", {"config_file": CONFIG_FILE})),),
    section=Section("mla", MLASettings, "MLA (MLA-BIN, section 2.2): the feature bank, the domain attention module "
                                        "and the attention-weighted combination of the sites' local models"),
    egress={MLATask.MLA_FEATURES: egress_feature_matrix, MLATask.MLA_EVALUATE: egress_mla_evaluation},
    site_limits=(
        SiteLimit("max_feature_width", DEFAULT_MAX_FEATURE_WIDTH,
                  f"most MLA feature values per image (default {DEFAULT_MAX_FEATURE_WIDTH})"),
        SiteLimit("max_feature_rows", None, "most images whose MLA feature vectors may leave (default: no cap)"),
    ),
    saved_models=(SavedModel("mla", "--bundle", "an MLA bundle folder (mla_bundle/ in an MLA job's server run "
                                                "folder): the attention-combined model is scored next to --model",
                             scorer="feddg.flare.mla.bundle:BundleScorer"),),
    train_meta=(SHARE_LOCAL_MODEL,),
    simulated_site_config={SHARE_LOCAL_MODEL: True},
)
