"""The rehearsal's own job, used when the command is given none."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

from feddg.experiment import TASK_DEFAULTS
from feddg.folders import claim
from feddg.recipes.export import write_job
from feddg.rehearsal.consortium import DEAD_CLIENT_GRACE, HEART_BEAT_TIMEOUT

SMALL_SITES = ["BIDMC", "BMC", "RUNMC"]  # the small job's hospitals; RUNMC is its unseen site
SMALL_ROUNDS = 20


def small_job(out: Path) -> Path:
    """Prostate GA on three hospitals (BIDMC and BMC train, RUNMC is unseen), ``SMALL_ROUNDS`` rounds of one epoch on
    32 px synthetic volumes with a narrow U-Net, written to ``out`` (replaced). Seconds a round on a 2-core machine,
    and rounds enough for the link drills to act mid-job; GA, so that ``server-restart`` checks that a resumed job
    continues a method's server history. At least one training site a round (so a lost site leaves a job that goes
    on), and a task timeout past the time NVFlare takes to declare a site gone."""
    exp = copy.deepcopy(TASK_DEFAULTS["prostate"])
    exp["data"].update(sites=SMALL_SITES, unseen_site="RUNMC", image_size=32,
                       synthetic={"seed": 0, "cases_per_site": 3, "slices_per_case": 4, "size": 32})
    exp["model"].update(features=[8, 8, 16, 32, 64, 8], dropout=0.0)
    exp["train"].update(rounds=SMALL_ROUNDS, local_epochs=1, batch_size=4, min_sites=1,
                        task_timeout=HEART_BEAT_TIMEOUT + DEAD_CLIENT_GRACE + 180)
    exp["eval"]["batch_size"] = 8
    if Path(out).exists():
        shutil.rmtree(out)
    return write_job(claim(out, "feddg rehearse-network (its small job)"), "prostate_ga", exp)
