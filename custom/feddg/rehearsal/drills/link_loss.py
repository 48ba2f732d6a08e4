"""``link-loss``: a training hospital's link goes down in a round, right after it delivered its update, and stays down
until the job ends.

Expected: the server drops it (its parent after ``HEART_BEAT_TIMEOUT`` s without a heartbeat, the job after NVFlare's
``DEAD_CLIENT_GRACE`` more), the job goes on with the rest (the small job's ``train.min_sites`` is 1), and the report
names the site and the round it was lost in; its evaluation is reported missing, never scored. The command brings
the link back after the job (:func:`feddg.rehearsal.processes.restore_links`) and adds how long the hospital took
to register again.

Why right after a delivered update, never while one is on the wire: NVFlare 2.9's server job downloads a streamed
update's arrays from the site after the message arrives, and when that download fails it exits the job process
(``nvflare/fuel/f3/cellnet/cell.py``, ``Adapter.call``: "failed to decode streamed submit_update ... exiting job
process to fail the job"). A link lost mid-upload thus leaves the download pending until the job's end and the job
ends ``FINISHED:EXECUTION_EXCEPTION`` although its workflow finished; a CI run of this drill hit it (stop 37, the
cut at a round's start caught the tiny job's first site already uploading). That is NVFlare's fail-fast choice, not
something a feddg component can catch; this drill rehearses the loss it is about, a site gone between uploads.
"""

from __future__ import annotations

import time

from feddg.poc import RehearsalError
from feddg.rehearsal.consortium import HEART_BEAT_TIMEOUT, Rehearsal
from feddg.rehearsal.outcomes import Check, DrillOutcome, round_seconds
from feddg.rehearsal.processes import log_size, rounds_completed, server_log_size, wait_for_line, wait_for_rounds

# What the site's job log says once the server has taken a result of it (NVFlare 2.9's ClientRunner logs it after the
# server's reply, so after the server downloaded the update): from then until its next upload, nothing is in flight.
RESULT_DELIVERED = "task result sent to"


def link_loss(r: Rehearsal, job_id: str) -> Check:
    """Cut the first training site's link for good, a full round after link-flap's cut and right after the site
    delivered an update; record it in ``r`` (the round and the site, which link-flap's check and the command read)."""
    cfg = r.cfg
    victim = cfg.data.train_sites[0]
    victim_log = r.poc.kit(victim) / job_id / "log.txt"  # the site's job process's log
    done = rounds_completed(r, job_id)
    wait_for_rounds(r, job_id, done + 2, 600)  # a full round after the flap's
    if not wait_for_line(victim_log, (RESULT_DELIVERED,), 600, log_size(victim_log), poll=0.05):
        raise RehearsalError(f"link-loss: {victim} delivered no result within 600 s (its job log {victim_log})")
    at_round = rounds_completed(r, job_id)
    r.loss_round = at_round
    left = cfg.train.rounds - at_round
    since = server_log_size(r)
    cut, cut_at = time.monotonic(), time.time()
    r.net.link(victim, up=False)
    r.cut.add(victim)
    r.loss_site = victim
    dropped = wait_for_line(r.server_log, (f"Remove the dead Client. Name: {victim}.",), HEART_BEAT_TIMEOUT + 120,
                            since)
    dropped_s = round(time.monotonic() - cut, 1) if dropped else None

    def check(report: dict) -> DrillOutcome:
        history = report.get("history", [])
        lost = [e for e in report.get("lost_sites", []) if e["site"] == victim]
        lost_round = lost[0]["round"] if lost else None
        declared_s = round(lost[0]["time"] - cut_at, 1) if lost else None
        after = [h for h in history if lost_round is not None and h["round"] > lost_round]
        final = report.get("models", {}).get("final", {})
        missing = victim in final.get("missing_sites", [])
        scored = sorted({row["site"] for row in report.get("table", [])})
        unseen_scored = cfg.data.unseen_site in scored
        figures = {"site": victim, "cut_in_round": at_round, "rounds_left_at_cut": left,
                   "dropped_by_server_after_s": dropped_s, "declared_disconnected_after_s": declared_s,
                   "lost_in_round": lost_round, "rounds": len(history),
                   "sites_per_round": [len(h["sites"]) for h in history], "round_s": round_seconds(report),
                   "evaluation_missing": final.get("missing_sites", []), "sites_scored": scored,
                   "job_status": report.get("job_status")}
        passed = (left >= 2 and lost_round is not None and len(history) == cfg.train.rounds and bool(after)
                  and all(victim not in h["sites"] for h in after) and missing and victim not in scored
                  and unseen_scored)
        if left < 2:
            detail = f"the job had {left} round(s) left when the drill could cut a link; give it more rounds"
        else:
            detail = (f"{victim}'s link cut in round {at_round}: dropped by the server after {dropped_s} s, declared "
                      f"disconnected by the job after {declared_s} s; report: lost in round {lost_round}, "
                      f"{len(after)} later round(s) without it, its evaluation "
                      + ("reported missing" if missing else "NOT reported missing")
                      + f"; unseen site {cfg.data.unseen_site} " + ("scored" if unseen_scored else "NOT scored"))
        return DrillOutcome("link-loss", passed, figures, detail)

    return check
