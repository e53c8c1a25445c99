"""The GPU check's report (gpu-check.md and .json in its --out folder): the parts' results, the targets judged from
what the parts wrote, and each part's figures. Only this run's files are read: one older than the part is stale."""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from ablations.bench.check.parts import Outcome, Part
from ablations.bench.check.targets import HEADER, bench_targets, row, runner_targets
from ablations.bench.gpu.report import decoding_table, profile_tables, training_table
from ablations.runs import folder as R
from ablations.training.clock import percentiles
from plumbing.files import write_atomic

BENCH = "bench-gpu"  # the bench part's report in the out folder: bench-gpu.md and bench-gpu.json
BROKEN_SO_FAR = "failed or erred by pytest's progress marks"  # a stage cut before its summary
PROGRESS = r"^([.FEsxX]+)(?=\s*\[|\s*$|\d)"  # pytest -q's progress: a mark per test, then [ NN%] (cut: anywhere)
GEMM = "gemm_fraction"  # final.json's share of the machine's fp32 GEMM rate: the runner writes it on a CPU only
RECOMPILES = re.compile(r"\[[\d/]+\] \[__recompiles\].*")  # TORCH_LOGS=recompiles: "[0/1] [__recompiles] ..."
WORK, OUT = "WORK", "OUT"  # how the report names the check's temporary folder and its --out folder


def epoch(started: str) -> float:
    return datetime.datetime.fromisoformat(started).timestamp()


def fresh_json(path: Path, since: float) -> dict | None:
    """The file's JSON if it was written at or after `since` (this part's start); None if missing, stale or damaged."""
    try:
        if path.stat().st_mtime < since:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def records(folder: Path) -> dict:
    """A run's records as gpu-check.json carries them: config and final as read, metrics as a list of its lines."""
    if not folder.is_dir():
        return {}
    return {R.CONFIG: R.read_json(folder / R.CONFIG), R.METRICS: R.read_metrics(folder), R.FINAL: R.read_final(folder)}


def runner_lines(folder: Path | None) -> list[str]:
    """What a run recorded: final.json's figures and its step times, per logged window and per step where logged."""
    if folder is None or not folder.is_dir():
        return ["no run folder was written"]
    final, metrics = R.read_final(folder) or {}, [m for m in R.read_metrics(folder) if "time_s" in m]

    def recorded(key: str, form: str = "{}") -> str:
        return "not recorded" if final.get(key) is None else form.format(final[key])

    lines = [
        f"{R.FINAL}: status {recorded('status')}, {recorded('steps')} steps on {recorded('device')}; steady state "
        f"(steps that compiled left out) {recorded('tokens_per_s', '{:,.0f}')} tokens/s, MFU {recorded('mfu', '{:.1%}')} "
        f"({recorded('peak_card')}); wall clock {recorded('wall_tokens_per_s', '{:,.0f}')} tokens/s; graphs compiled "
        f"{recorded('compiles')}, compiling {recorded('compile_s', '{:.1f} s')}; dev PPL {recorded('dev_ppl', '{:.1f}')}, "
        f"BLEU {recorded('bleu', '{:.2f}')}, scoring {recorded('eval_s', '{:.0f} s')}"
    ]
    if final.get(GEMM) is not None:  # a CPU's run: on a GPU, MFU against the card's peak is the figure
        lines.append(f"{GEMM} (model FLOP/s over this CPU's measured fp32 GEMM rate): {recorded(GEMM, '{:.0%}')}")
    if "ddp" in final:
        lines.append(
            f"data-parallel: {'DDP over ' + str(final.get('dist_backend')) if final['ddp'] else 'no (one plain process)'}"
        )
    if final.get("error"):
        lines.append(f"error: {final['error']}")
    windows, last = [], (0, 0.0)
    for m in metrics:
        windows.append((m["step"], (m["time_s"] - last[1]) / max(m["step"] - last[0], 1)))
        last = (m["step"], m["time_s"])
    if len(windows) > 1:
        p = percentiles([s for _, s in windows[1:]])
        lines.append(
            f"step time per logged window (time_s deltas / steps), windows after the first: p50 {p['p50'] * 1e3:.1f} ms, "
            f"p99 {p['p99'] * 1e3:.1f} ms, max {p['max'] * 1e3:.1f} ms over {len(windows) - 1} windows; the first "
            f"(to step {windows[0][0]}, where compiling falls) {windows[0][1] * 1e3:.1f} ms"
        )
    steps = [m for m in metrics if m.get("step_s_p50") is not None]
    if steps:
        longest = max(m.get("step_s_max_all") or m["step_s_max"] for m in steps)
        lines.append(
            f"per step (the runner's own step times per window): median of the windows' p50 "
            f"{percentiles([m['step_s_p50'] for m in steps])['p50'] * 1e3:.1f} ms, longest step, compiling ones "
            f"included, {longest * 1e3:.1f} ms, compiling {sum(m.get('compile_s') or 0 for m in steps):.1f} s"
        )
    else:
        lines.append(f"per-step times: not recorded in {R.METRICS}")
    return lines


def recompile_lines(log: Path, shown: int = 30) -> list[str]:
    """What TORCH_LOGS=recompiles wrote into the part's log: each recompile, the guard that failed and where."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = RECOMPILES.findall(text.replace("\r", "\n"))
    if not found:
        return ["recompiles (TORCH_LOGS=recompiles): none logged"]
    more = [f"and {len(found) - shown} more lines in logs/{log.name}"] if len(found) > shown else []
    return [
        f"recompiles (TORCH_LOGS=recompiles), {len(found)} lines:",
        *(f"`{x.strip()}`" for x in found[:shown]),
        *more,
    ]


def bench_lines(report: Path, since: float) -> list[str]:
    bench = fresh_json(report, since)
    if bench is None:
        return [f"no report of this run at {report.name} (missing, damaged, or older than the part)"]
    lines = [f"status: {bench['status']}", ""] if bench.get("status") else []
    return [
        *lines,
        *training_table(bench.get("training", []), bench.get("backend", "")),
        "",
        *decoding_table(bench.get("decoding", [])),
        "",
        *profile_tables(bench.get("profiles", [])),
        *bench.get("notes", []),
    ]


def tests_lines(log: Path, shown: int = 30) -> list[str]:
    """Per stage, pytest's closing line (or how far its progress got), then each failed or erring test by name."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = []
    for stage in re.split(r"^==== ", text, flags=re.M)[1:]:
        name = stage.split(":", 1)[0]
        closing = [
            line for line in stage.splitlines() if re.search(r"\d+ (passed|failed|error|deselected|skipped)", line)
        ]
        progress = re.findall(r"\[\s*(\d+)%\]", stage)
        marks = "".join(re.findall(PROGRESS, stage, flags=re.M))
        broken_so_far = marks.count("F") + marks.count("E")
        lines.append(
            f"{name}: "
            + (
                closing[-1].strip("= ")
                if closing
                else f"cut short, {broken_so_far} {BROKEN_SO_FAR} ({len(marks)} run)"
                if broken_so_far
                else f"cut short after {len(marks)} tests, none failed by pytest's progress marks"
                if marks
                else f"progress {progress[-1]}% of the collected tests"
                if progress
                else "no test result"
            )
        )
        broken = re.findall(r"^((?:FAILED|ERROR) \S+)", stage, flags=re.M)
        lines += broken[:shown] + ([f"and {len(broken) - shown} more"] if len(broken) > shown else [])
    return lines or ["no test result"]


def tail(log: Path, lines: int = 15) -> str:
    """The last lines of a part's output, progress bars left out."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    kept = [line for line in text.replace("\r", "\n").splitlines() if line.strip() and not re.search(r"\d%\|", line)]
    return "\n".join(kept[-lines:])


def targets(out: Path, outcomes: dict[str, Outcome], runner: Path | None, quick: bool) -> list[str]:
    """The targets of docs/benchmark.md against what the bench part and the runner part's run folder hold."""
    lines = [
        "## Targets",
        "",
        "Set for one GPU at the base size" + (": at tiny sizes these rows only exercise the code." if quick else "."),
        "",
        *HEADER,
    ]
    bench = fresh_json(out / f"{BENCH}.json", epoch(outcomes["bench"].started)) if "bench" in outcomes else None
    try:
        lines += bench_targets(bench) if bench else [row("the bench's targets", "-", "-", "not measured: no report")]
    except (KeyError, TypeError):
        lines.append(row("the bench's targets", "-", "-", "not measured: its report lacks the figures"))
    if runner is None or not runner.is_dir():
        return [*lines, row("the runner's targets", "-", "-", "not measured: no run folder")]
    return [*lines, *runner_targets(R.read_metrics(runner), R.read_final(runner) or {})]


def shown(command: tuple[str, ...], work: Path, out: Path) -> str:
    """A command as the report shows it, with no machine's folders: `python`, the work folder as WORK, the out folder
    as OUT, other paths relative to the working folder."""
    words = ["python" if w == sys.executable else w.replace(str(work), WORK).replace(str(out), OUT) for w in command]
    return shlex.join(os.path.relpath(w) if os.path.isabs(w) else w for w in words)


def markdown(meta: dict, parts: list[Part], outcomes: list[Outcome], body: dict[str, list[str]], work: Path) -> str:
    out = Path(meta["out"])
    total = sum(x.seconds for x in outcomes)
    lines = [
        "# GPU check: the Table 3 runner on one GPU",
        "",
        f"Run by `python -m ablations.bench.check {meta['args']}`".rstrip()
        + f" on {meta['device']} ({meta['peak']}), torch {meta['torch']}, Python {meta['python']}, "
        f"transformers {meta['transformers']}, commit {meta['commit']}, started {meta['date']}. Data: {meta['data']}. "
        f"Parts run: {len(outcomes)} of {len(parts)}, {total:.0f} s of at most {sum(p.limit_s for p in parts)} s. "
        f"{WORK} is a temporary folder, removed afterwards; {OUT} the folder of this report.",
        "",
        "| part | what | limit | started | result | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p.name} | {p.what} | {p.limit_s} s | {x.started[11:19]} | {x.result} | {x.seconds:.0f} |"
        for p, x in zip(parts, outcomes)
    ]
    lines += [f"| {p.name} | {p.what} | {p.limit_s} s | - | not run yet | - |" for p in parts[len(outcomes) :]]
    lines += ["", *body["targets"]]
    for part, outcome in zip(parts, outcomes):
        lines += ["", f"## {part.name}: {outcome.result}", ""]
        lines += [f"`{shown(stage.command, work, out)}`  " for stage in part.stages]
        lines += ["", *(f"- stage {s}" for s in outcome.stages if len(part.stages) > 1), ""]
        lines += [line if line.startswith("|") or not line else f"- {line}" for line in body[part.name]]
        if outcome.tail:
            lines += ["", "The end of its output:", "", "```", outcome.tail, "```"]
    return "\n".join(lines) + "\n"


def write_report(
    meta: dict,
    parts: list[Part],
    outcomes: list[Outcome],
    body: dict[str, list[str]],
    work: Path,
    kept: dict[str, dict] | None = None,
) -> None:
    """gpu-check.md and gpu-check.json (which also carries each runner part's records: config, metrics, final)."""
    out = Path(meta["out"])
    write_atomic(out / "gpu-check.md", markdown(meta, parts, outcomes, body, work))
    entries = [
        {
            "name": p.name,
            "what": p.what,
            "limit_s": p.limit_s,
            "commands": [shown(s.command, work, out) for s in p.stages],
            **asdict(x),
            "lines": body.get(p.name, []),
            **({"records": kept[p.name]} if (kept or {}).get(p.name) else {}),
        }
        for p, x in zip(parts, outcomes)
    ]
    record = {k: v for k, v in meta.items() if k != "out"}
    write_atomic(out / "gpu-check.json", json.dumps({**record, "parts": entries}, indent=2) + "\n")
