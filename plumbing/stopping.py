"""Graceful stops: Ctrl-C (SIGINT) and SIGTERM (what SLURM and torchrun send) end a command cleanly, a grid resumably.

While `graceful_stops()` is active, a signal that arrives during a training step waits for the step to end
(the loop then writes a checkpoint and raises Stopped); one that arrives anywhere else (reading data,
scoring) raises Stopped at once, abandoning that work, which a re-run does again. A second signal never
waits. Stopped is a BaseException, like KeyboardInterrupt, so that no `except Exception` records it as a
failed run.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """The process was asked to stop by `signum`; `where` says what was saved."""

    def __init__(self, signum: int, where: str = "") -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}{f' ({where})' if where else ''}")
        self.signum, self.where = signum, where

    @property
    def exit_status(self) -> int:
        """The shell's convention: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


class _Pending:
    deferring = False  # inside a training step: a first signal waits for its end
    signum: int | None = None


_pending = _Pending()


def _handler(signum: int, frame: object) -> None:
    if _pending.deferring and _pending.signum is None:
        _pending.signum = signum
        return
    raise Stopped(signum)


@contextmanager
def graceful_stops() -> Iterator[None]:
    """SIGINT and SIGTERM handled as above for the duration; the previous handlers come back afterwards.
    Off the main thread (where Python cannot take signals) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _pending.deferring, _pending.signum = False, None


@contextmanager
def step() -> Iterator[None]:
    """A region that a first stop signal lets finish (one training step and its bookkeeping)."""
    _pending.deferring = True
    try:
        yield
    finally:
        _pending.deferring = False


def requested() -> int | None:
    """The signal that asked for a stop during a step, if one did."""
    return _pending.signum


def stops_cleanly(what_then: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """A command's main under graceful_stops: Ctrl-C or SIGTERM ends it with one line, "stopped by SIGINT: <what_then>",
    and the shell's exit status, instead of a traceback (for commands with no step to finish, such as a benchmark)."""

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                with graceful_stops():
                    return main(*args, **kwargs)
            except Stopped as stop:
                print(f"{stop}: {what_then}", file=sys.stderr)
                return stop.exit_status

        return run

    return wrap
