"""The on-disk results format (see README.md, Ablations): one directory per run, files written atomically.

    <runs>/<budget>/<row>-s<seed>-<confighash8>/
        config.json    what the run is: row, seed, budget, preset, model spec, model config, training settings
        metrics.jsonl  one line per logged step: step, loss, lr, tokens_per_s, time_s (and dev_ppl at evaluations)
        final.json     written once the run has ended: status finished | diverged | failed, metrics, provenance
        attempts.json  how many times the run failed (bounded retries)
        checkpoint.pt  the latest training state, checksummed (never committed)
        checkpoint.prev.pt  the one before, used when the latest is damaged
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pandas as pd

CONFIG, METRICS, FINAL, ATTEMPTS, CHECKPOINT = "config.json", "metrics.jsonl", "final.json", "attempts.json", "checkpoint.pt"
PUBLISHED = (CONFIG, METRICS, FINAL)
CONFIG_FIELDS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "pe")


def config_hash(identity: dict) -> str:
    """Eight hex digits of a hash of everything that makes a run what it is (model config, training settings, data, spec)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]


def run_dir(runs: Path, budget: str, row: str, seed: int, identity: dict) -> Path:
    return runs / budget / f"{row}-s{seed}-{config_hash(identity)}"


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN: a metric that is not a finite number is written as null (NaN in the results table)."""
    return x if x is not None and math.isfinite(x) else None


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside path, then rename over it: readers see the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def append_metrics(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({k: finite_or_none(v) if isinstance(v, float) else v for k, v in record.items()}) + "\n")


def read_metrics(path: Path) -> list[dict]:
    """The logged records; a line cut short by a kill is skipped."""
    records = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").split("\n"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records up to a checkpoint's step (a resumed run logs the later steps again)."""
    kept = [r for r in read_metrics(path) if r.get("step", math.inf) <= step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def previous_checkpoint(path: Path) -> Path:
    """Where the checkpoint before the latest is kept: checkpoint.pt -> checkpoint.prev.pt."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def status(directory: Path) -> str:
    """'finished', 'diverged' or 'failed' from final.json, else 'partial' (a checkpoint) or 'new'."""
    final = read_json(directory / FINAL)
    if final is not None:
        return final["status"]
    latest = directory / CHECKPOINT
    return "partial" if latest.is_file() or previous_checkpoint(latest).is_file() else "new"


def summary(directories: list[Path]) -> str:
    """A grid's closing lines: how its runs ended, then each run that did not finish with the reason from final.json."""
    statuses = [status(d) for d in directories]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("finished", "diverged", "failed", "partial", "new") if s in statuses)
    lines = [f"{len(directories)} runs: {counts}"]
    for directory, state in zip(directories, statuses):
        if state == "finished":
            continue
        config = read_json(directory / CONFIG) or {}
        reason = (read_json(directory / FINAL) or {}).get("error") or "no result yet: interrupted; a re-run resumes it"
        if "out of memory" in reason.lower():
            reason += " (give the step more micro-batches of fewer tokens: --accumulation 2, 4, ...)"
        lines.append(f"  {config.get('row', '?')} s{config.get('seed', '?')} {state}: {reason}  [{directory}]")
    return "\n".join(lines)


def failed_attempts(directory: Path) -> int:
    return (read_json(directory / ATTEMPTS) or {}).get("failed", 0)


def record_failure(directory: Path, error: str) -> int:
    previous = read_json(directory / ATTEMPTS) or {"failed": 0, "errors": []}
    record = {"failed": previous["failed"] + 1, "errors": [*previous["errors"], error]}
    write_json(directory / ATTEMPTS, record)
    return record["failed"]


def results_table(runs: Path) -> pd.DataFrame:
    """Every final.json under runs as one row; the model config's fields become columns of their own."""
    records = []
    for path in sorted(runs.rglob(FINAL)):
        final = read_json(path)
        if final is None:
            continue
        config = final.pop("config", {}) or {}
        records.append({**final, **{k: config.get(k) for k in config}, "run_dir": path.parent.name})
    table = pd.DataFrame.from_records(records)
    if table.empty:
        return table
    for column in ("dev_ppl", "bleu", "bleu_tokenized", "tokens_per_s", "mfu", "wall_s"):
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce")  # null -> NaN
    return table
