"""The options of ``feddg rehearse-network`` and the names of its drills, import-light.

``feddg rehearse-network --help`` and the option checks read only this module (no NVFlare, no torch): the drills
themselves (:mod:`feddg.rehearsal.drills`) and the command that runs them (:mod:`feddg.rehearsal.command`) are
imported when the rehearsal runs. The command maps each name declared here to its drill; a test checks that the two
agree.
"""

from __future__ import annotations

import argparse

from feddg.numbers import seconds
from feddg.rehearsal.network import DEFAULT_SUBNET

# The drills, in the order they run: those that act while the rehearsal's job runs, then those that run after it.
DURING_JOB_DRILLS = ("exposure", "link-flap", "foreign-kit", "link-loss")
AFTER_JOB_DRILLS = ("server-restart",)
DRILLS = [*DURING_JOB_DRILLS, *AFTER_JOB_DRILLS]


def parse_drills(text: str) -> list[str]:
    """``--drills``: ``all`` or comma-separated names, returned in the order the drills run; ValueError naming the
    unknown ones and the valid names."""
    names = list(DRILLS) if text == "all" else [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in names if d not in DRILLS]
    if unknown:
        raise ValueError(f"unknown drill(s) {unknown}; the drills are {list(DRILLS)} (or all)")
    return [d for d in DRILLS if d in names]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options, on ``parser`` (``feddg rehearse-network``, :func:`feddg.rehearsal.command.main`)."""
    parser.add_argument("job", nargs="?", default=None,
                        help="a job folder (default: a small job of its own, three hospitals, see "
                             "feddg.rehearsal.small_job)")
    parser.add_argument("--workspace", default="/tmp/feddg/rehearsal", help="folder (deleted and recreated)")
    parser.add_argument("--drills", default="all", help=f"all, or some of {','.join(DRILLS)}; '' for none")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="the test hosts' subnet, inside 198.18.0.0/15")
    parser.add_argument("--timeout", type=seconds, default=3600, help="seconds to wait for each job")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change a feddg.yaml setting of the job (repeatable)")
