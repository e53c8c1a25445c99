"""A run's folder, its one owner: where it is, what its files are called, how they are written and read.

    <runs>/<budget>/<row>-s<seed>-<confighash8>/
        config.json    what the run is: row, seed, budget, preset, model spec, model config, training settings
        metrics.jsonl  one line per logged step: step, loss, lr, the window's steady tokens_per_s, step_s_p50,
                       step_s_max (plain steps), step_s_max_all (compiling ones too), compile_s, compiles, time_s (and
                       dev_ppl at evaluations); a stop between logging steps adds one line marked "stopped"
        final.json     written once the run has ended: status finished | diverged | failed, metrics, provenance
        attempts.json  how many times the run failed (bounded retries)
        dev_hypotheses.txt  the beam-search output on the dev set
        checkpoint.pt  the latest training state, checksummed (never committed)
        checkpoint.prev.pt  the one before, used when the latest is damaged
        .lock          held (flock) by the one process training the run; the kernel releases it when that process dies

Whatever a reader finds here may be damaged or foreign (a half-copied folder, an edited file): readers
never fail on it; they skip it with a one-line warning naming the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pandas as pd

from ablations.runs.budgets import TrainSettings
from model.config import TransformerConfig
from plumbing.files import StorageError, replace, write_atomic

CONFIG, METRICS, FINAL, ATTEMPTS, CHECKPOINT = (
    "config.json",
    "metrics.jsonl",
    "final.json",
    "attempts.json",
    "checkpoint.pt",
)
HYPOTHESES, WEIGHTS = "dev_hypotheses.txt", "model.pt"  # model.pt: a bare state_dict, where a run keeps no checkpoint
LOCK = ".lock"
PUBLISHED = (CONFIG, METRICS, FINAL)
STATUSES = ("finished", "diverged", "failed")
BUSY = "running elsewhere"  # a run whose lock another process holds


def config_hash(identity: dict) -> str:
    """Eight hex digits of a hash of everything that makes a run what it is (model config, training settings, data, spec)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Run:
    """One (row, seed) of a grid, planned once before anything runs: its folder and what makes it what it is.

    `identity` is what config.json holds, and its hash names the folder, so that the same request finds the same
    folder again: a run that ended is skipped, one cut short resumes."""

    directory: Path
    identity: dict
    settings: TrainSettings
    config: TransformerConfig

    @classmethod
    def at(cls, root: Path, identity: dict, settings: TrainSettings, config: TransformerConfig) -> Run:
        """The run of `identity` under the runs root: <root>/<budget>/<row>-s<seed>-<hash>."""
        name = f"{identity['row']}-s{identity['seed']}-{config_hash(identity)}"
        return cls(root / identity["budget"] / name, identity, settings, config)

    @property
    def key(self) -> str:
        """The identity's hash (the folder name's last part): a checkpoint records it to say whose it is."""
        return self.directory.name.rpartition("-")[2]

    @property
    def row(self) -> str:
        return self.identity["row"]

    @property
    def seed(self) -> int:
        return self.identity["seed"]

    @property
    def label(self) -> str:
        """'<row> s<seed>', for people."""
        return f"{self.row} s{self.seed}"


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN: a metric that is not a finite number is written as null (NaN in the results table)."""
    return x if x is not None and math.isfinite(x) else None


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# --- writing: atomic (plumbing.files), and a full disk or a read-only folder is one line naming the path --------------


def write_json(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_final(directory: Path, final: dict) -> None:
    """final.json, metrics that are not finite as null."""
    write_json(directory / FINAL, {k: finite_or_none(v) if isinstance(v, float) else v for k, v in final.items()})


def append_metrics(directory: Path, record: dict) -> None:
    """One logged step to metrics.jsonl, metrics that are not finite as null."""
    path = directory / METRICS
    line = json.dumps({k: finite_or_none(v) if isinstance(v, float) else v for k, v in record.items()}) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
    except OSError as exc:
        raise StorageError(path, exc) from None


def truncate_metrics(directory: Path, step: int) -> None:
    """Keep the records up to a checkpoint's step (a resumed run logs the later steps again), less the record of the
    steps a stop cut off from their logging window (it stands for the run cut short; resumed, that window is logged)."""
    kept = [r for r in read_metrics(directory) if r["step"] <= step and not r.get("stopped")]
    write_atomic(directory / METRICS, "".join(json.dumps(r) + "\n" for r in kept))


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


def record_failure(directory: Path, error: str) -> int:
    """Add a failed attempt and its error to attempts.json; returns the failures so far."""
    previous = read_json(directory / ATTEMPTS) or {}
    errors = previous.get("errors") if isinstance(previous.get("errors"), list) else []
    record = {"failed": failed_attempts(directory) + 1, "errors": [*errors, error]}
    write_json(directory / ATTEMPTS, record)
    return record["failed"]


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


def read_config(directory: Path) -> dict | None:
    """The run's config.json (what the run is); None when it is missing or damaged."""
    return read_json(directory / CONFIG)


def _final(directory: Path, identity: bool) -> tuple[dict | None, str | None]:
    """final.json read once: (the result, None), or (None, why it cannot be read as an ended run's result), or
    (None, None) when there is no file."""
    path = directory / FINAL
    if not path.is_file():
        return None, None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"not readable JSON ({type(exc).__name__})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    if value.get("status") not in STATUSES:
        return None, f"status {value.get('status')!r} is none of {', '.join(STATUSES)}"
    if identity and (not isinstance(value.get("row"), str) or not isinstance(value.get("seed"), int)):
        return None, "no row or seed"
    return value, None


def final_problem(directory: Path, identity: bool = False) -> str | None:
    """Why the run's final.json cannot be read as an ended run's result (None when it can, or when there is no file);
    with `identity`, a result must also say its row and seed (the tables need them)."""
    return _final(directory, identity)[1]


def read_final(directory: Path) -> dict | None:
    """An ended run's result (final.json); None when there is none or it is damaged (final_problem says why)."""
    return _final(directory, identity=False)[0]


def read_metrics(directory: Path) -> list[dict]:
    """The logged records of metrics.jsonl; a line cut short by a kill, or otherwise not a record, is skipped."""
    path, records = directory / METRICS, []
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


def previous_checkpoint(path: Path) -> Path:
    """Where the checkpoint before the latest is kept: checkpoint.pt -> checkpoint.prev.pt."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def status(directory: Path, final: dict | None = None) -> str:
    """'finished', 'diverged' or 'failed' from final.json (`final`, where the caller has read it), else 'partial'
    (a checkpoint) or 'new'."""
    final = final if final is not None else read_final(directory)
    if final is not None:
        return final["status"]
    latest = directory / CHECKPOINT
    return "partial" if latest.is_file() or previous_checkpoint(latest).is_file() else "new"


@dataclass(frozen=True)
class Recorded:
    """What a run folder holds, each file read once: config.json and final.json (None where missing or damaged)."""

    directory: Path
    config: dict | None
    final: dict | None

    @property
    def status(self) -> str:
        return status(self.directory, self.final)


def recorded(directory: Path) -> Recorded:
    return Recorded(directory, read_config(directory), read_final(directory))


def failed_attempts(directory: Path) -> int:
    failed = (read_json(directory / ATTEMPTS) or {}).get("failed", 0)
    return failed if isinstance(failed, int) else 0


# --- gathering ----------------------------------------------------------------------------------------------------


def run_folders(root: Path, holding: str = CONFIG) -> list[Path]:
    """Every run folder under root that holds the file `holding` (CONFIG: every run begun; FINAL: every run ended)."""
    return sorted(path.parent for path in root.rglob(holding))


def ended_results(root: Path) -> list[tuple[Path, dict]]:
    """Every run folder under root with a readable final.json, and its result; a damaged one is skipped with a
    warning naming it."""
    found = []
    for directory in run_folders(root, FINAL):
        final, problem = _final(directory, identity=True)
        if problem:
            warn(f"skipping {directory / FINAL}: {problem}")
            continue
        found.append((directory, final))
    return found


def results_table(root: Path) -> pd.DataFrame:
    """Every final.json under root as one row; the model config's fields become columns of their own."""
    records = []
    for directory, final in ended_results(root):
        config = final.pop("config", {})
        config = config if isinstance(config, dict) else {}
        records.append({**final, **config, "run_dir": directory.name})
    table = pd.DataFrame.from_records(records)
    if table.empty:
        return table
    for column in ("dev_ppl", "bleu", "bleu_tokenized", "tokens_per_s", "mfu", "gemm_fraction", "wall_s"):
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce")  # null -> NaN
    return table
