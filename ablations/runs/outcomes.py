"""How a grid's runs ended, for people: a line per run under the progress bar, and the closing table with the reason
for every run that did not finish. Read from the run folders, the one source of truth."""

from __future__ import annotations

import math
from pathlib import Path

from tabulate import tabulate

from ablations.runs import folder as R


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


def outcome_line(row: str, seed: int, status: str, directory: Path) -> str:
    """One run's line under the grid's bar, rounded for people."""
    if status == R.BUSY:
        return f"{row:>4} s{seed}: {status} ({R.holder(directory)})  {directory}"
    final = R.read_final(directory) or {}
    metrics = [f"dev PPL {rounded(final.get('dev_ppl'), 1) or '-'}", f"BLEU {rounded(final.get('bleu'), 2) or '-'}"]
    if isinstance(final.get("params"), int):
        metrics.append(f"{final['params'] / 1e6:.2f}M params")
    if final.get("wall_s") is not None:
        metrics.append(duration(final["wall_s"]))
    return f"{row:>4} s{seed}: {status:<8}  {'  '.join(metrics)}  {directory}"


def summary(directories: list[Path], busy: set[Path] = frozenset()) -> str:
    """A grid's closing lines: a table of its runs (row, seed, status, dev PPL, BLEU, tokens/s, wall time), how they
    ended, then each run that did not finish with the reason; `busy` are runs another process was training."""
    runs = [R.recorded(d) for d in directories]
    statuses = [run.status for run in runs]  # a busy run may have ended by now: then its own status shows
    statuses = [
        R.BUSY if run.directory in busy and state not in R.STATUSES else state for run, state in zip(runs, statuses)
    ]
    table = []
    for run, state in zip(runs, statuses):
        config, final = run.config or {}, run.final or {}
        table.append(
            [
                config.get("row", "?"),
                config.get("seed", "?"),
                state,
                rounded(final.get("dev_ppl"), 1),
                rounded(final.get("bleu"), 2),
                rounded(final.get("tokens_per_s"), 0),
                duration(final.get("wall_s")),
            ]
        )
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in (*R.STATUSES, "partial", "new", R.BUSY) if s in statuses)
    lines = [
        tabulate(
            table, headers=["row", "seed", "status", "dev PPL", "BLEU", "tokens/s", "wall time"], disable_numparse=True
        ),
        f"{len(directories)} runs: {counts}",
    ]
    for run, state, (row, seed, *_) in zip(runs, statuses, table):
        if state == "finished":
            continue
        if state == R.BUSY:
            reason = f"{R.holder(run.directory)} holds its lock; it is not run twice"
        else:
            reason = (run.final or {}).get("error") or "no result yet: interrupted; a re-run resumes it"
        if "out of memory" in reason.lower():
            reason += " (give the step more micro-batches of fewer tokens: --accumulation 2, 4, ...)"
        lines.append(f"  {row} s{seed} {state}: {reason}  [{run.directory}]")
    return "\n".join(lines)
