"""Resume drill in a real POC: a running GA job is aborted after two rounds, its result downloaded, and
`feddg resume-job` turns it into a new job that trains only the rounds left, from the last global model, with GA's
weight history continued; together the two jobs train the configured total."""

from __future__ import annotations

import json
import time

import pytest

from feddg.recipes.export import write_job
from feddg.poc import admin, download, prepare, start, stop, submit, wait
from feddg.resume import resume_job
from tests.conftest import on_poc_ports
from tests.e2e.test_poc_drills import SITES, _experiment

pytestmark = [pytest.mark.slow, on_poc_ports]
TOTAL = 8  # with rounds of a few seconds, enough left after two for the abort (an admin session) to land


def test_resume_drill_an_aborted_run_continues_as_a_new_job(tmp_path):
    exp = _experiment()
    exp["train"].update(rounds=TOTAL, local_epochs=8, task_timeout=120)
    job = write_job(tmp_path / "jobs", "prostate_ga", exp)
    p = prepare(tmp_path / "poc", "prostate", SITES)
    try:
        start(p)
        first = submit(p, job)
        progress = p.kit(p.server) / first / "feddg_progress.json"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if progress.exists() and json.loads(progress.read_text())["rounds_completed"] >= 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the first job did not complete two rounds within 300 s")
        admin(p, ["abort", first, "--force"], 120, "job abort")
        assert wait(p, first, 300) != "FINISHED:COMPLETED"
        previous = tmp_path / "first_result"
        admin(p, ["download", first, "-o", str(previous), "--force"], 300, "job download")
        done = json.loads(next(previous.rglob("feddg_progress.json")).read_text())["rounds_completed"]  # 2 or more
        assert 2 <= done < TOTAL

        resumed, start_round, total = resume_job(job, previous, tmp_path / "resumed")
        assert (start_round, total) == (done, TOTAL)
        second = submit(p, resumed)
        assert wait(p, second, 600) == "FINISHED:COMPLETED"
        report = json.loads(download(p, second, tmp_path / "second_result").read_text())
        assert [h["round"] for h in report["history"]] == list(range(done, TOTAL))
        written = [f for f in (tmp_path / "second_result").rglob("ga_weights.json") if f.parent.name != "resume"]
        ga = json.loads(written[0].read_text())["history"]  # the run's own file, not the copy the job carried
        assert [h["round"] for h in ga] == list(range(TOTAL))
    finally:
        stop(p)
