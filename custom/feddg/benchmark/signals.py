"""SIGINT and SIGTERM during a sweep: a run in progress is stopped and recorded first, then the sweep ends with
:class:`Interrupted`, which the CLI reports in one line with exit status 130 or 143 (not a traceback, not a
silent end)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class Interrupted(BaseException):
    """SIGINT or SIGTERM ended the sweep, after the runs in progress (``stopped``: their ids, none if none ran)
    were stopped with every process they started and recorded as interrupted. A BaseException, as
    KeyboardInterrupt is: no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int, stopped: Sequence[str] = ()) -> None:
        self.signum, self.stopped = signum, tuple(stopped)
        super().__init__(signum, self.stopped)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process a signal ended (130 SIGINT, 143 SIGTERM)."""
        return 128 + self.signum

    def __str__(self) -> str:
        one = len(self.stopped) == 1
        *rest, last = self.stopped or ("",)
        runs = f"{', '.join(rest)} and {last}" if rest else last
        what = (f"{runs} {'was' if one else 'were'} stopped with every process "
                f"{'it' if one else 'they'} started and recorded as interrupted (the same command runs "
                f"{'it' if one else 'them'} again)" if self.stopped else
                "no run was stopped; the finished runs keep their records")
        return f"interrupted by {signal.Signals(self.signum).name}: {what}"


class _StopSignals:
    """SIGINT and SIGTERM while a sweep runs. Outside a deferred block a signal raises :class:`Interrupted` at once;
    inside one (a run and its record, the tables) it is noted in ``received`` for the block to act on, and raised
    when the block ends."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._depth = 0
        self._deferring = 0

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum
        if not self._deferring:
            raise Interrupted(signum)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers for the block (nested blocks share the outer one's); the previous handlers are restored
        after it. Outside the main thread, where Python cannot install handlers, nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if not self._depth else {}
        if not self._depth:
            self.received = None
            for sig in previous:
                signal.signal(sig, self._handle)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals wait for the end of the block, which raises :class:`Interrupted` then if one came."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        self.raise_received()

    def raise_received(self, stopped: Sequence[str] = ()) -> None:
        """Raise :class:`Interrupted` (naming the runs ``stopped``, if any) when a signal came."""
        if self.received is not None:
            raise Interrupted(self.received, stopped)


STOP_SIGNALS = _StopSignals()


def handle_stop_signals() -> Any:
    """A context manager: SIGINT and SIGTERM raise :class:`Interrupted` in the block (the CLI's exit status 130 or
    143, in one line) instead of a traceback or a silent end; a run in progress is stopped and recorded first."""
    return STOP_SIGNALS.installed()
