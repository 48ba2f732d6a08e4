"""Argument types for numeric command-line options: every float option of a command is one of these, so ``nan``
(which passes ``x > 0`` checks written as ``not x <= 0``, and never ends a wait) and ``inf`` (a wait without a
bound) are refused by argparse with the option's name, before anything runs."""

from __future__ import annotations

import argparse
import math


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return value


def finite(text: str) -> float:
    """Any finite number."""
    return _number(text)


def non_negative(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more")
    return value


def positive(text: str) -> float:
    """A finite number > 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number")
    return value


def seconds(text: str) -> float:
    """A bound on a wait: a finite number of seconds > 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value
