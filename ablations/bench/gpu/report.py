"""The GPU benchmark's report (reports/bench-gpu.md and .json): the machine, how the steps were timed, and the tables
of ablations/bench/gpu/timing.py's rows. Only measured numbers; an entry without a timing says why. Rewritten at every
stage of the run, so that a stop or a kill leaves the last complete report, marked with how far it got."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.files import StorageError, write_atomic


def _num(value: float | None, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}{unit}"


def mfu_note(meta: dict) -> str:
    if meta["precision"] != "bf16":
        return (
            "MFU not reported: the steps ran in fp32, and the peak it would be held to is the card's bf16 dense peak."
        )
    if meta["peak_bf16_flops"] is None:
        on = "a CPU has no bf16 dense peak to hold it to" if meta["device"].startswith("cpu") else "the card is unknown"
        return f"MFU not reported: {on} (ablations/training/peaks.py lists the cards)."
    return (
        f"MFU: model FLOPs (6 per weight per real token, model.params.training_flops) over the card's bf16 dense peak, "
        f"{meta['peak_bf16_flops'] / 1e12:.0f} TFLOP/s."
    )


def training_table(rows: list[dict], backend: str) -> list[str]:
    """The training rows as a markdown table; 'vs eager' divides by the same system's eager entry under `backend` at
    the run's precision (a 'bf16 weights' row by the autocast one beside it)."""
    base = {
        (r["size"], r["system"]): r["tgt_tokens_per_s"]
        for r in rows
        if r["mode"] == "eager" and r["backend"] == backend and r["tgt_tokens_per_s"] and not weights(r)
    }
    lines = [
        f"| size | system | mode | attention | precision | timed steps | target tok/s | p50 ms | p99 ms | max ms | MFU | "
        f"warm-up s (graphs compiled; steps that compiled) | compiling in timed steps | peak GiB | vs eager, {backend} "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate, ref = r["tgt_tokens_per_s"], base.get((r["size"], r["system"]))
        lines.append(
            f"| {r['size']} | {r['system']} | {r['mode']} | {r['backend']} | {r.get('precision', '-')} | "
            f"{r['timed_steps']} | {_num(rate, digits=0)} | "
            f"{_num(r['step_s_p50'], 1e3)} | {_num(r['step_s_p99'], 1e3)} | {_num(r['step_s_max'], 1e3)} | "
            f"{_num(r['mfu'], 100, unit='%')} | "
            f"{r['warmup_s']:.1f} ({r['warmup_compiles']}; {r['warmup_compiling_steps']}) | "
            f"{r['timed_compiling_steps']} ({r['timed_compiling_s']:.1f} s) | {_num(r['peak_gib'])} | "
            f"{f'{rate / ref:.2f}x' if rate and ref else '-'} | {'' if r['status'] == 'measured' else r['status']} |"
        )
    return lines


def weights(row: dict) -> bool:
    """Whether the row trained a bf16 copy of the model on fp32 master weights (ablations/training/precision.py)."""
    return row.get("precision") == "bf16 weights"


def decoding_table(rows: list[dict]) -> list[str]:
    ref = {r["size"]: r["output_tokens_per_s"] for r in rows if r["system"] == "reference beam_search"}
    lines = [
        "| size | system | timed searches | s (median) | output tokens | output tok/s | vs reference | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate, base = r["output_tokens_per_s"], ref.get(r["size"])
        lines.append(
            f"| {r['size']} | {r['system']} | {r['reps']} | {_num(r['s'], digits=3)} | {r['output_tokens']} | "
            f"{_num(rate, digits=0)} | {f'{rate / base:.2f}x' if rate and base else '-'} | "
            f"{'' if r['status'] == 'measured' else r['status']} |"
        )
    return lines


def profile_tables(profiles: list[dict]) -> list[str]:
    """Each profiled step's top rows as a markdown table, headed by what it is; one without a table says why."""
    lines = []
    for p in profiles:
        what = f"{p['size']}, {p['system']}, {p['mode']}, {p['backend']}"
        if p["status"] != "measured":
            lines += [f"One {what} step: {p['status']}.", ""]
            continue
        lines += [
            f"One {what} step ({p['profiled_s'] * 1e3:,.1f} ms under the profiler): its top {len(p['rows'])} "
            f"{p['ranked']}, of {p['total_ms']:,.1f} ms in all ({p['launches']:,} "
            f"{'kernels launched' if p['ranked'].startswith('kernels') else 'operator calls'}).",
            "",
            "| name | self ms | share | calls |",
            "|---|---|---|---|",
            *(
                f"| {r['name'][:100].replace('|', '/')} | {r['self_ms']:,.2f} | {r['share']:.1%} | {r['calls']} |"
                for r in p["rows"]
            ),
            "",
        ]
    return lines


def batches_line(about: dict) -> str:
    return (
        f"{about['size']}: real {about['preset']} training batches (its budget's data and {about['vocab']}-token BPE) "
        f"of at most {about['batch_tokens']} positions per side, padded to multiples of {about['pad_multiple']}; the "
        f"{about['timed_reps']} timed repetitions' batches hold {about['shapes']} distinct shapes, "
        f"{about['mean_tgt_tokens']:,.0f} real target tokens on average; padding is {about['padding']:.0%} of their "
        "positions."
    )


def status_line(report: dict) -> str:
    """What a report that is not the run's last says about itself."""
    when = f"written {report['written']} by the run started {report['started_at']}"
    if report["status"] == "started":
        return f"**Started**, nothing measured yet ({when}): {report['stage']}."
    return f"**{report['status'].capitalize()}** ({when}): {report['stage']}; the tables hold what was measured before."


def data_line(report: dict) -> str:
    how = "; ".join(f"{name}: {how}" for name, how in report["data_from"].items())
    return f"Data ready after {report['prepare_s']:.1f} s, before the time limit's clock starts ({how or 'not yet'})."


def markdown(report: dict) -> str:
    """The report (the run's settings and what they measured, as Progress.write gathers them) as markdown."""
    meta, training, decoding, notes = report, report["training"], report["decoding"], report["notes"]
    others = [b for b in meta["backends"] if b != meta["backend"]]
    command = f"python -m ablations.bench.gpu {meta['args']}".strip()
    limit = ""
    if meta["time_limit"]:
        limit = (
            f" Time limit {meta['time_limit']:.0f} s (`--time-limit`) from when the data is ready, under an alarm that "
            f"ends the work where it is; a compile starts only when the time left holds one (`--compile-estimate` "
            f"{meta['compile_estimate']:.0f} s until one is measured) and its timed steps. Work it left no room for "
            "says so."
        )
    lines = [
        "# GPU benchmark: training step and beam search beside peers",
        "",
        *([status_line(report), ""] if report["status"] != "complete" else []),
        f"Measured by `{command}` on {meta['device']}, torch {meta['torch']}, commit {meta['commit']}, {meta['date']} "
        f"(host: {meta['cpu']}, {meta['cores']} cores). {data_line(report)}",
        "",
        f"Training: {'bf16 autocast (the loss in fp32)' if meta['precision'] == 'bf16' else 'fp32'}, fused Adam at a "
        "fixed learning rate of 1e-4"
        + (
            "; the reference also eager with bf16 weights (precision 'bf16 weights': a bf16 copy of the model steps "
            "fp32 master weights, the runner's precision on a GPU, ablations/training/precision.py)"
            if meta.get("bf16_weights")
            else ""
        )
        + f"; compiled = torch.compile (backend {meta['compile_backend']}, dynamic=True: one "
        "compile serves every batch shape, source and target lengths apart symbols) of the model's forward, and of "
        "the reference's loss its work on each chunk of logits (ablations/training/compiling.py). Attention "
        f"backend of every mode: {meta['backend']} (the runner's choice on a GPU is efficient); "
        + (f"also timed eager: {', '.join(others)} (`--backends`). " if others else "")
        + mfu_note(meta),
        "",
        *(f"- {batches_line(about)}" for about in meta["batches"]),
        "",
        f"Every entry first takes {meta['warmup']} untimed warm-up steps (column 'warm-up s': torch.compile's compiling "
        f"is there), then up to {meta['steps']} timed steps. Eager entries come first, interleaved on the same batch "
        "in each repetition (the order reversed every other one), then beam search, then each compiled entry in turn, "
        "its compile and its timed steps, so that no compile runs beside a timed eager step. Timed steps are clocked "
        "as the runner clocks its own (ablations/training/clock.py): on CUDA, events at each step's start and end, "
        "read after the timed steps, with no wait for the GPU between steps. A timed step in which torch compiled a "
        "graph is counted apart, not in the percentiles. p99 is the nearest rank: of fewer than 100 steps it is the "
        f"largest.{limit}",
        "",
        "## Training step",
        "",
        *training_table(training, meta["backend"]),
        "",
        "## Where a step's time goes (torch.profiler)",
        "",
        "One more step of the reference after its timed steps, eager and compiled: on a GPU its kernels ranked by self "
        "device time (not the operators that launch them), on the CPU its operators by self CPU time.",
        "",
        *(profile_tables(report["profiles"]) or ["No step profiled yet.", ""]),
        "## Beam search (beam 4, batched)",
        "",
        f"{meta['decode']['sentences']} dev sources cut to {meta['decode']['length']} tokens; the reference searches up "
        f"to source length + {meta['decode']['extra']} (untrained weights rarely end earlier), HF generate is forced "
        f"to exactly {meta['decode']['length'] + meta['decode']['extra']} new tokens; one untimed search each, then "
        f"up to {meta['decode']['reps']} timed ones, interleaved. Output tokens: those produced, EOS included. On a "
        "GPU each reference search decodes at fixed shapes and replays its captured second step as a CUDA graph "
        "(ablations/scoring/graphs.py; the capture is timed with the search).",
        "",
        *decoding_table(decoding),
    ]
    if notes:
        lines += ["", *(f"- {line}" for line in notes)]
    lines += ["", f"Regenerate: `{command}`."]
    return "\n".join(lines) + "\n"


@dataclass
class Progress:
    """The report as the run goes, rewritten whole (the JSON, then the markdown, each atomically) at every stage, so
    that a stop or a kill at any moment leaves the last one, its status saying how far it got: started, partial,
    stopped, failed or complete. The first write replaces an earlier run's report, which is never taken for this
    one's."""

    out: Path
    meta: dict  # the run's settings; its sizes and systems order the rows
    training: dict[tuple, dict] = field(default_factory=dict)  # by size, system, mode, attention backend, precision
    decoding: list[dict] = field(default_factory=list)
    profiles: list[dict] = field(default_factory=list)  # ablations/bench/gpu/profiling.py's records
    notes: list[str] = field(default_factory=list)

    def add_training(self, rows: list[dict]) -> None:
        for r in rows:
            self.training[r["size"], r["system"], r["mode"], r["backend"], r.get("precision")] = r

    def write(self, status: str, stage: str = "") -> None:
        sizes, systems = self.meta["sizes"], self.meta["systems"]
        rows = sorted(self.training.values(), key=lambda r: (sizes.index(r["size"]), systems.index(r["system"])))
        written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        report = {**self.meta, "status": status, "stage": stage, "written": written, "training": rows}
        report |= {"decoding": self.decoding, "profiles": self.profiles, "notes": self.notes}
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(self.out.parent, exc) from None
        write_atomic(self.out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
        write_atomic(self.out, markdown(report))
