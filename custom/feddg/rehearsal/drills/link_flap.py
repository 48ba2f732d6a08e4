"""``link-flap``: a training hospital's link goes down for ``FLAP_SECONDS``, shorter than the heartbeat timeout,
once a round has been completed, then comes back. Expected: every round has every training site."""

from __future__ import annotations

import time

from feddg.rehearsal.consortium import Rehearsal
from feddg.rehearsal.outcomes import Check, DrillOutcome, round_seconds
from feddg.rehearsal.processes import rounds_completed, wait_for_rounds

FLAP_SECONDS = 10  # how long the link stays down: well under consortium.HEART_BEAT_TIMEOUT


def link_flap(r: Rehearsal, job_id: str) -> Check:
    """Cut the last training site's link for ``FLAP_SECONDS`` after the job's first round; the check counts the
    rounds that had every training site (up to link-loss's cut, when that drill runs in the same job)."""
    cfg = r.cfg
    victim = cfg.data.train_sites[-1]
    wait_for_rounds(r, job_id, 1, 600)
    at_round = rounds_completed(r, job_id)
    cut = time.time()
    r.net.link(victim, up=False)
    time.sleep(FLAP_SECONDS)
    r.net.link(victim, up=True)

    def check(report: dict) -> DrillOutcome:
        # with link-loss in the same job, the rounds from its cut on lack its site by design
        end = r.loss_round if r.loss_round is not None else cfg.train.rounds
        history = [h for h in report.get("history", []) if h["round"] < end]
        train = set(cfg.data.train_sites)
        full = [h["round"] for h in history if set(h["sites"]) == train]
        durations = round_seconds(report)[:end]
        figures = {"site": victim, "link_down_s": FLAP_SECONDS, "cut_in_round": at_round,
                   "rounds_checked": len(history), "sites_per_round": [len(h["sites"]) for h in history],
                   "round_s": durations, "cut_round_waited_s": (round(durations[at_round] - min(durations), 1)
                                                                if len(durations) > at_round else None)}
        passed = len(history) == end > at_round + 1 and len(full) == len(history)
        detail = (f"{victim}'s link was down {FLAP_SECONDS} s in round {at_round} (from "
                  f"{time.strftime('%H:%M:%S', time.localtime(cut))}); "
                  + (f"rounds 0-{end - 1} all had every training site" if passed else
                     f"rounds with every training site: {len(full)} of the {len(history)} before round {end}"))
        return DrillOutcome("link-flap", passed, figures, detail)

    return check
