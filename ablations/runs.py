"""The on-disk results format (see README.md, Ablations): one directory per run, files written atomically.

    <runs>/<budget>/<row>-s<seed>-<confighash8>/
        config.json    what the run is: row, seed, budget, preset, model spec, model config, training settings
        metrics.jsonl  one line per logged step: step, loss, lr, tokens_per_s, time_s (and dev_ppl at evaluations)
        final.json     written once the run has ended: status finished | diverged | failed, metrics, provenance
        attempts.json  how many times the run failed (bounded retries)
        checkpoint.pt  the latest training state, checksummed (never committed)
        checkpoint.prev.pt  the one before, used when the latest is damaged
        .lock          held (flock) by the one process training the run; the kernel releases it when that process dies

Whatever a reader finds here may be damaged or foreign (a half-copied folder, an edited file): readers
never fail on it; they skip it with a one-line warning naming the file.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd
from tabulate import tabulate

CONFIG, METRICS, FINAL, ATTEMPTS, CHECKPOINT = "config.json", "metrics.jsonl", "final.json", "attempts.json", "checkpoint.pt"
LOCK = ".lock"
PUBLISHED = (CONFIG, METRICS, FINAL)
STATUSES = ("finished", "diverged", "failed")
BUSY = "running elsewhere"  # a run whose lock another process holds


def shown_path(path: Path) -> str:
    """A path relative to the working directory when it lies inside it, so that committed reports carry no machine's paths."""
    path, here = path.resolve(), Path.cwd().resolve()
    return path.relative_to(here).as_posix() if path.is_relative_to(here) else str(path)


def config_hash(identity: dict) -> str:
    """Eight hex digits of a hash of everything that makes a run what it is (model config, training settings, data, spec)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]


def run_dir(runs: Path, budget: str, row: str, seed: int, identity: dict) -> Path:
    return runs / budget / f"{row}-s{seed}-{config_hash(identity)}"


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN: a metric that is not a finite number is written as null (NaN in the results table)."""
    return x if x is not None and math.isfinite(x) else None


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# --- writing: atomic, and a full disk or a read-only folder is one line naming the path ---------------------------

class StorageError(Exception):
    """A result file that could not be written (full disk, read-only folder, ...); the message names the path."""

    def __init__(self, path: Path, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        code = errno.errorcode.get(exc.errno or 0, "")
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free some space or pass --runs DIR on another disk"
        elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            fix = "make the folder writable or pass --runs DIR on a writable disk"
        else:
            fix = "check the folder"
        super().__init__(f"cannot write {path}: {reason}{f' ({code})' if code else ''}; {fix}, then run again "
                         f"(finished runs are kept; an unfinished one resumes from its last checkpoint)")
        self.path = path


def temporary(path: Path) -> Path:
    """A temporary name beside path, private to this process (two writers never share one)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def put_bytes(path: Path, data: bytes) -> None:
    """The one writer of result bytes: data to path, flushed to the disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace(source: Path, target: Path) -> None:
    try:
        os.replace(source, target)
    except OSError as exc:
        raise StorageError(target, exc) from None


def write_file(path: Path, data: bytes, target: Path | None = None) -> None:
    """put_bytes, with a failure (a full disk, ...) a StorageError naming the target (path itself, or the file a
    temporary path stands for) and nothing half-written left behind."""
    try:
        put_bytes(path, data)
    except OSError as exc:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
        raise StorageError(target or path, exc) from None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary file beside path, then rename over it: readers see the old file or the new, never half."""
    tmp = temporary(path)
    write_file(tmp, data.encode() if isinstance(data, str) else data, path)
    replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def append_metrics(path: Path, record: dict) -> None:
    line = json.dumps({k: finite_or_none(v) if isinstance(v, float) else v for k, v in record.items()}) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
    except OSError as exc:
        raise StorageError(path, exc) from None


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete temporary files a killed writer left in a run directory (call it holding the run's lock)."""
    stale = [p for p in directory.glob(".*.tmp*") if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def set_aside(path: Path, why: str) -> Path:
    """Rename a damaged or foreign file out of the way (kept for inspection, never deleted): final.json -> final.json.<why>."""
    target, n = path.with_name(f"{path.name}.{why}"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{why}{n}")
    replace(path, target)
    return target


# --- one writer per run -------------------------------------------------------------------------------------------

@contextmanager
def claim(directory: Path) -> Iterator[bool]:
    """Try to take the run's lock without waiting: True while this process holds it, False if another process does.

    An OS lock (flock) on <run>/.lock: the kernel releases it when the holder exits or dies, so a killed run is
    free again at once, and two processes, fan-out workers or SLURM jobs never train the same run.
    """
    try:
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StorageError(directory / LOCK, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def holder(directory: Path) -> str:
    """Who holds (or last held) a run's lock, as written into the lock file: 'pid N on HOST'."""
    try:
        return (directory / LOCK).read_text(encoding="utf-8", errors="replace").strip() or "another process"
    except OSError:
        return "another process"


# --- reading: damaged or foreign files never stop a reader ---------------------------------------------------------

def read_json(path: Path) -> dict | None:
    """A JSON object from path; None if the file is missing, unreadable, not JSON or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def final_problem(path: Path, identity: bool = False) -> str | None:
    """Why final.json cannot be read as an ended run's result (None when it can, or when there is no file);
    with `identity`, a result must also say its row and seed (the tables need them)."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"not readable JSON ({type(exc).__name__})"
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    if value.get("status") not in STATUSES:
        return f"status {value.get('status')!r} is none of {', '.join(STATUSES)}"
    if identity and (not isinstance(value.get("row"), str) or not isinstance(value.get("seed"), int)):
        return "no row or seed"
    return None


def read_final(path: Path) -> dict | None:
    """An ended run's result; None when there is none or it is damaged (final_problem says why)."""
    return None if final_problem(path) or not path.is_file() else read_json(path)


def read_metrics(path: Path) -> list[dict]:
    """The logged records; a line cut short by a kill, or otherwise not a record, is skipped."""
    records = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    except OSError:
        return records
    for line in text.split("\n"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records up to a checkpoint's step (a resumed run logs the later steps again)."""
    kept = [r for r in read_metrics(path) if r["step"] <= step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def previous_checkpoint(path: Path) -> Path:
    """Where the checkpoint before the latest is kept: checkpoint.pt -> checkpoint.prev.pt."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def status(directory: Path) -> str:
    """'finished', 'diverged' or 'failed' from final.json, else 'partial' (a checkpoint) or 'new'."""
    final = read_final(directory / FINAL)
    if final is not None:
        return final["status"]
    latest = directory / CHECKPOINT
    return "partial" if latest.is_file() or previous_checkpoint(latest).is_file() else "new"


def failed_attempts(directory: Path) -> int:
    failed = (read_json(directory / ATTEMPTS) or {}).get("failed", 0)
    return failed if isinstance(failed, int) else 0


def record_failure(directory: Path, error: str) -> int:
    previous = read_json(directory / ATTEMPTS) or {}
    errors = previous.get("errors") if isinstance(previous.get("errors"), list) else []
    record = {"failed": failed_attempts(directory) + 1, "errors": [*errors, error]}
    write_json(directory / ATTEMPTS, record)
    return record["failed"]


# --- gathering ----------------------------------------------------------------------------------------------------

def ended_results(runs: Path) -> list[tuple[Path, dict]]:
    """Every readable final.json under runs with its path; a damaged one is skipped with a warning naming it."""
    found = []
    for path in sorted(runs.rglob(FINAL)):
        problem = final_problem(path, identity=True)
        if problem:
            warn(f"skipping {path}: {problem}")
            continue
        found.append((path, read_json(path)))
    return found


def results_table(runs: Path) -> pd.DataFrame:
    """Every final.json under runs as one row; the model config's fields become columns of their own."""
    records = []
    for path, final in ended_results(runs):
        config = final.pop("config", {})
        config = config if isinstance(config, dict) else {}
        records.append({**final, **config, "run_dir": path.parent.name})
    table = pd.DataFrame.from_records(records)
    if table.empty:
        return table
    for column in ("dev_ppl", "bleu", "bleu_tokenized", "tokens_per_s", "mfu", "gemm_fraction", "wall_s"):
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce")  # null -> NaN
    return table


def duration(seconds: float | None) -> str:
    """Seconds for people: 42 s, 3 min 05 s, 2 h 14 min."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rounded(x: object, digits: int) -> str:
    return f"{x:,.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else ""


def summary(directories: list[Path], busy: set[Path] = frozenset()) -> str:
    """A grid's closing lines: a table of its runs (row, seed, status, dev PPL, BLEU, tokens/s, wall time), how they
    ended, then each run that did not finish with the reason; `busy` are runs another process was training."""
    statuses = [status(d) for d in directories]  # a busy run may have ended by now; else it is still the other's
    statuses = [BUSY if d in busy and state not in STATUSES else state for d, state in zip(directories, statuses)]
    table = []
    for directory, state in zip(directories, statuses):
        config, final = read_json(directory / CONFIG) or {}, read_final(directory / FINAL) or {}
        table.append([config.get("row", "?"), config.get("seed", "?"), state, rounded(final.get("dev_ppl"), 1),
                      rounded(final.get("bleu"), 2), rounded(final.get("tokens_per_s"), 0), duration(final.get("wall_s"))])
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in (*STATUSES, "partial", "new", BUSY) if s in statuses)
    lines = [tabulate(table, headers=["row", "seed", "status", "dev PPL", "BLEU", "tokens/s", "wall time"],
                      disable_numparse=True), f"{len(directories)} runs: {counts}"]
    for directory, state, (row, seed, *_) in zip(directories, statuses, table):
        if state == "finished":
            continue
        if state == BUSY:
            reason = f"{holder(directory)} holds its lock; it is not run twice"
        else:
            reason = (read_final(directory / FINAL) or {}).get("error") or "no result yet: interrupted; a re-run resumes it"
        if "out of memory" in reason.lower():
            reason += " (give the step more micro-batches of fewer tokens: --accumulation 2, 4, ...)"
        lines.append(f"  {row} s{seed} {state}: {reason}  [{directory}]")
    return "\n".join(lines)
