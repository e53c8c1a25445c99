"""What keeps one property's trouble its own: a time limit, the adapter member named in an error, the harness's limits.

Time limit: SIGALRM on the main thread raises `TimedOut` inside whatever runs, so a forward that loops in Python is
interrupted and the property is recorded as `error: timed out after N s`; the run goes on. A hang inside one C call
(a torch kernel, a lock) is interrupted only when that call returns to Python, and off the main thread, or where there
is no SIGALRM (Windows), there is no limit. A limit set by someone else (pytest-timeout's signal method) is put back.

Harness limits: the harness samples sentences of up to 8 positions from the spec's own vocabulary (8 distinct tokens
besides padding, for the checks that need distinct ones). A config too small for that is the harness's limit, said as
such, never a finding or advice aimed at the model.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

DEFAULT_TIMEOUT_S = (
    300.0  # per property; the base model's slowest property takes seconds under ci, minutes under thorough
)
POSITIONS = 8  # the longest sentence a pinned case samples on the spec's own config (residual_paths)
TOKENS = POSITIONS + 1  # distinct non-pad tokens for the longest sentence, and the padding token
NO_BATCH = (
    "params_base",
    "params_table3",
    "params_tied_embeddings",
    "paper_parameters",
)  # they count parameters, sampling nothing
HARNESS = Path(__file__).resolve().parent  # invariants/: frames here are the harness's, not the adapter's
MODEL = HARNESS.parent / "model"
MODEL_HELPERS = (  # model/ files whose functions the harness calls on an adapter's behalf: never "the model's"
    "batch.py",
    "params.py",
    "paper_params.py",
    "objective.py",
    "config.py",
    "registry.py",
    "protocol.py",
    "files.py",
)


class NotApplicable(Exception):
    """Raised by a check that finds, while running, that it has nothing to judge on this model (say why)."""


class Skipped(Exception):
    """A case this property cannot judge on this model (a config the adapter refuses, matrices not told apart at it):
    the engine leaves it out and names it in the verdict's reason; `what` says which case, `why` why."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what} ({why})")
        self.what, self.why = what, why


class HarnessLimit(NotApplicable):
    """The harness cannot build this property's cases on the spec's config (a vocabulary too small to sample from)."""


STOP: dict[str, str] = {}  # "signal": the name of the signal that asked the run to stop (SIGINT, SIGTERM), once it has


def stop_on(signum: int, frame) -> None:
    """The handler of SIGINT and SIGTERM while the suite runs: note which, and stop as Ctrl-C does (KeyboardInterrupt),
    so that the verdicts reached are written. A KeyboardInterrupt an adapter raises itself carries no note: it is that
    property's error, not a stop. The watchdog (time_limit) comes in as a SIGINT too: then it is a time-out."""
    if WATCHDOG.pop("fired", None):
        raise TimedOut(WATCHDOG.pop("why", "timed out"))
    STOP["signal"] = signal.Signals(signum).name
    raise KeyboardInterrupt(STOP["signal"])


WATCHDOG: dict[str, str] = {}  # "fired": set by the watchdog thread just before it interrupts the main thread
WATCHDOG_GRACE_S = 30.0  # after the SIGALRM limit: time for a C call to return before the watchdog steps in


def harness_stop(exc: BaseException) -> bool:
    """Whether exc ends the run (a time limit, or a signal the user sent) rather than being the model's doing. Where
    stop_on is not the handler (the suite called from Python, from pytest), every KeyboardInterrupt is a stop."""
    if isinstance(exc, TimedOut):
        return True
    return isinstance(exc, KeyboardInterrupt) and ("signal" in STOP or signal.getsignal(signal.SIGINT) is not stop_on)


class TimedOut(BaseException):
    """Raised in the running property when its time is up (a BaseException, so that neither the adapter's nor
    hypothesis's `except Exception` retries it)."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise TimedOut in this block after `seconds` (None or 0: no limit; see the module docstring for where it acts)."""
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame) -> None:
        raise TimedOut(f"timed out after {seconds:g} s")

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    # A model can cancel the alarm (signal.alarm(0), SIGALRM ignored): a watchdog thread then interrupts the main
    # thread itself, through the SIGINT handler the command line installs (stop_on), as a time-out.
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds + WATCHDOG_GRACE_S) and signal.getsignal(signal.SIGINT) is stop_on:
            WATCHDOG.update(fired="1", why=f"timed out after {seconds:g} s (the model cancelled the alarm?)")
            _thread.interrupt_main(signal.SIGINT)

    threading.Thread(target=watch, name="aiayn watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # someone else's alarm: re-armed with what was left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


def member_at_fault(exc: BaseException, innermost: bool = False) -> str:
    """Where in the adapter an exception came from: 'the model's forward (mine.py:42)', the first frame of the
    traceback outside the harness and the libraries (the member the harness called; with innermost, the deepest
    such frame: the line of the model's own code that raised), or '' when there is none."""
    frames = traceback.extract_tb(exc.__traceback__)
    return member_frame(reversed(frames) if innermost else frames)


def member_frame(frames: Iterable[traceback.FrameSummary]) -> str:
    """The first of these frames that is the model's own code (not the harness's, not a library's), in words."""
    for frame in frames:
        if not _harness(frame.filename) and not _library(frame.filename):
            return f"the model's {frame.name} ({Path(frame.filename).name}:{frame.lineno})"
    return ""


def _harness(filename: str) -> bool:
    path = Path(filename).resolve()
    return path.is_relative_to(HARNESS) or (path.parent == MODEL and path.name in MODEL_HELPERS)


def _library(filename: str) -> bool:
    return any(part in filename for part in ("/torch/", "/hypothesis/", "/contextlib.py", "/functools.py", "<"))


def harness_limit(prop: str, vocab_size: int, max_len: int) -> str | None:
    """Why the harness cannot run `prop` on the spec's own config, or None: the limit is the harness's sampler's."""
    if prop in NO_BATCH:
        return None
    if vocab_size < TOKENS:
        return (
            f"not applicable at vocab_size={vocab_size}: this property needs at least {TOKENS} tokens (the harness "
            f"samples up to {POSITIONS} distinct ones besides padding); a limit of the harness, not of the model"
        )
    if max_len < POSITIONS:
        return (
            f"not applicable at max_len={max_len}: this property needs at least {POSITIONS} positions (the harness's "
            f"sentences on the spec's own config are up to {POSITIONS} long); a limit of the harness, not of the model"
        )
    return None
