"""How the GPU check runs its parts: each a sequence of commands (stages) under one time limit, every process it
started stopped at the limit, its children included, and the check told what happened.

A part's stages run in turn while its time lasts (the tests part: the CUDA-only tests, then the device-sensitive ones,
then the rest); a stage that would start with less than `min_s` left is skipped and said so, and a best-effort stage
cut at the limit fails nothing (the part passes, saying so). A process still running GRACE_S before the limit gets
the part's stop signal, SIGKILL KILL_S before the limit. Processes that left the part's process group
(`start_new_session`) are found through /proc and stopped too: the check makes itself their subreaper, so that even
orphans stay its descendants (Linux; elsewhere the process group alone is stopped).
"""

from __future__ import annotations

import ctypes
import datetime
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

GRACE_S = 5  # a stage that runs on is sent its stop signal this long before the part's limit, SIGKILL after it
KILL_S = 2  # SIGKILL comes this long before the limit: killing a large process and reaping its strays take time too
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


@dataclass(frozen=True)
class Stage:
    """One command of a part; `min_s`: it does not start with fewer seconds than this left of the part's limit;
    `best_effort`: cut at the limit, it does not fail the part (the tests part's later stages: what time allows)."""

    name: str
    command: tuple[str, ...]
    min_s: float = 0.0
    best_effort: bool = False


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    stages: tuple[Stage, ...]
    limit_s: int
    skip: str = ""  # why it does not run ('': it runs)
    stop_with: signal.Signals = signal.SIGTERM  # sent GRACE_S before the limit; SIGKILL follows, KILL_S before it
    env: dict[str, str] = field(default_factory=dict)  # added to the check's environment


@dataclass(frozen=True)
class Outcome:
    result: str  # passed, failed (exit N), timed out at its limit of N s, skipped: why
    seconds: float
    started: str  # UTC, ISO 8601: files older than this are not this part's
    stages: tuple[str, ...]  # each stage's name and result
    lines: tuple[str, ...] = ()  # what it measured
    tail: str = ""  # the end of its output, where it did not pass


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process rather than to init, so `descendants` still finds them."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def descendants(root: int) -> list[int]:
    """Every living process below `root`, by their parents in /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            # /proc/PID/stat: pid (comm) state ppid ...; comm may hold spaces and parentheses
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def reap(pids: list[int], wait_s: float = 1.0) -> None:
    """Collect the exit status of those `pids` that are this process's children (orphans it adopted): no zombies."""
    end = time.perf_counter() + wait_s
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not a child of this process, or already collected
                break
            if done or time.perf_counter() > end:
                break
            time.sleep(0.01)


def stop(process: subprocess.Popen, first: signal.Signals, others: set[int]) -> None:
    """End the stage's process and everything it started: `first` to its group, SIGKILL GRACE_S - KILL_S later to
    whatever of it is still alive: its group, and the processes below this one that were not here before it (`others`
    were)."""
    strays = set(descendants(process.pid))
    try:
        os.killpg(process.pid, first)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=GRACE_S - KILL_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    left = sorted((strays | set(descendants(os.getpid()))) - others)
    _signal_all(left, signal.SIGKILL)
    process.wait()
    reap(left)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_part(part: Part, log: Path, cwd: Path) -> Outcome:
    """Run the part's stages in turn with their output in `log`, under the part's limit; a stage's failure does not
    stop the next one (each says what it is)."""
    started_at, started = utc_now(), time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **part.env}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))
    results, timed_out, cut = [], False, []  # cut: the best-effort stage stopped at the limit
    with log.open("w") as out:
        for stage in part.stages:
            left = part.limit_s - (time.perf_counter() - started)
            if timed_out or left - GRACE_S < max(stage.min_s, 1):
                results.append(f"{stage.name}: not started, {max(left, 0):.0f} s of the limit left")
                continue
            out.write(
                f"==== {stage.name}: {shlex.join('python' if w == sys.executable else w for w in stage.command)}\n"
            )
            out.flush()
            others = set(descendants(os.getpid()))
            process = subprocess.Popen(
                stage.command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
            )
            try:  # stopped GRACE_S before the limit, so that its stop too is inside the limit
                code = process.wait(timeout=left - GRACE_S)
                results.append(f"{stage.name}: {'passed' if code == 0 else f'failed (exit {code})'}")
            except subprocess.TimeoutExpired:
                timed_out = True
                results.append(f"{stage.name}: stopped at the part's limit" + (" (best effort)" * stage.best_effort))
                cut += [stage.name] if stage.best_effort else []
            finally:
                if process.poll() is None or set(descendants(os.getpid())) - others:  # running, or left strays
                    stop(process, part.stop_with, others)
    seconds = time.perf_counter() - started
    return Outcome(verdict(part, results, timed_out and not cut, cut), seconds, started_at, tuple(results))


def verdict(part: Part, results: list[str], timed_out: bool, cut: list[str]) -> str:
    """The part's result from its stages': a failure fails it; a required stage cut at the limit times it out; a
    best-effort stage cut there, after the others passed, leaves it passed, with a note."""
    if timed_out:
        return f"timed out at its limit of {part.limit_s} s"
    if any(": failed" in r for r in results):
        failures = [r.replace("failed (", "").rstrip(")") for r in results if ": failed" in r]
        if len(part.stages) > 1:
            return f"failed ({'; '.join(failures)})"
        return failures[0].replace(f"{part.stages[0].name}: ", "failed (") + ")"
    if cut:
        return f"passed ({cut[0]}, best effort, cut at the limit of {part.limit_s} s)"
    if any(": not started" in r for r in results):
        return "passed (not every stage started)"
    return "passed"
