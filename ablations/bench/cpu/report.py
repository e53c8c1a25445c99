"""The CPU benchmark's report (reports/bench.md): the markdown of its tables, with the clock and load it ran under."""

from __future__ import annotations

from ablations.bench.variants import UNDONE

CLOCK_NOTES = {
    "wall": "Times are wall-clock: on a loaded machine other processes take the cores at random moments, which "
    "interleaving spreads over every system but does not remove (rerun idle, or with `--clock cpu`).",
    "cpu": "Times are this process's CPU time (`--clock cpu`), which other processes' load does not enter, so the "
    "ratios hold on a busy machine; a row on more than one thread sums its threads' time (total work, not latency).",
}


def markdown(meta: dict, training: list[dict], decoding: list[dict], skipped: list[str]) -> str:
    """The report: how it was measured, the training and beam-search tables, each speed choice's ratio, and skips."""
    ref = {r["size"]: r for r in training if r["variant"] == "reference"}
    lines = [
        *conditions(meta, training),
        *training_table(training, ref),
        *choices_table(training, decoding, ref),
        *decoding_table(meta, decoding),
    ]
    if skipped:
        lines += ["", *(f"- {line}" for line in skipped)]
    return "\n".join(lines) + "\n"


def conditions(meta: dict, training: list[dict]) -> list[str]:
    """The title and what every figure was measured under: machine, load, clock, batches, threads, GEMM rate."""
    rates = {(r["size"], r["threads"]): r["gemm_flops_per_s"] for r in training}
    gemm = ", ".join(
        f"{rate / 1e9:.0f} GFLOP/s on {n} thread{'s' * (n > 1)} ({size})" for (size, n), rate in rates.items()
    )
    return [
        "# Benchmark: training step and beam search beside real peers, base and scaled (/8) sizes",
        "",
        f"Measured by `nox -s bench{' -- ' + meta['args'] if meta['args'] else ''}` on {meta['cpu']} ({meta['cores']} cores), "
        f"torch {meta['torch']}, commit {meta['commit']}, {meta['date']}. Load average (1 min) {meta['load_before']:.1f} at the "
        f"start and {meta['load_after']:.1f} at the end on {meta['cores']} cores. Every figure is the median of repetitions "
        f"interleaved across systems. {CLOCK_NOTES[meta['clock']]} The reference's decoding kernels "
        f"(model/kernels/): {meta['attention_kernel']}.",
        "",
        f"Training: {', '.join(f'{meta[k]} ({k[6:]})' for k in meta if k.startswith('steps_'))} timed steps after {meta['warmup']} warm-up step(s), the same {meta['preset']} training "
        f"batches of about {meta['batch_tokens']} source and target positions for every system (the first of the stream "
        "the grid trains on: bucketed by length, so little padding), fp32; token ids from a "
        f"{meta['vocab']}-token BPE (the scaled models' vocabulary; the base models keep the paper's 37000 entries). "
        f"Threads: {meta['threads']} unless a row says otherwise (`--threads` or OMP_NUM_THREADS override). "
        f"GEMM calibration (fp32 1024x512 @ 512x2048, median over the repetitions): {gemm}. The fraction of the GEMM "
        "rate counts 6 FLOPs per weight per token (model.params.training_flops).",
        "",
    ]


def training_table(training: list[dict], ref: dict[str, dict]) -> list[str]:
    """One row per variant's training step, each beside the reference at its size (`ref`)."""
    lines = [
        "## Training step",
        "",
        "| size | variant | threads | s/step | target tok/s | src+tgt tok/s | fraction of GEMM rate | vs reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in training:
        lines.append(
            f"| {r['size']} | {r['variant']} | {r['threads']} | {r['step_s']:.3f} | {r['tgt_tokens_per_s']:,.0f} | "
            f"{r['tokens_per_s']:,.0f} | {r['gemm_fraction']:.0%} | {r['tgt_tokens_per_s'] / ref[r['size']]['tgt_tokens_per_s']:.2f}x |"
        )
    return lines


def choices_table(training: list[dict], decoding: list[dict], ref: dict[str, dict]) -> list[str]:
    """The reference's speed-up over each UNDONE row, in training and then in beam search: what each choice bought."""
    lines = [
        "",
        "## What each speed choice changed (same run)",
        "",
        "Each row undoes one choice of the reference (or all of them) and reports the reference's speed-up over it. "
        "The thread count is chosen for safety, not speed: one thread up to d_model 128 and the free cores above, "
        "because a thread that waits for a busy core stalls every op; a speed-up below 1 there means this machine "
        "had cores to spare (alone on an idle machine, pass --threads).",
        "",
        "| size | choice undone | before: target tok/s | reference: target tok/s | speed-up |",
        "|---|---|---|---|---|",
    ]
    for r in (r for r in training if r["variant"].startswith(UNDONE)):
        after = ref[r["size"]]["tgt_tokens_per_s"]
        lines.append(
            f"| {r['size']} | {r['variant'][len(UNDONE) :]} | {r['tgt_tokens_per_s']:,.0f} | {after:,.0f} | "
            f"{after / r['tgt_tokens_per_s']:.2f}x |"
        )
    for d in (d for d in decoding if d["system"].startswith(UNDONE)):
        after = next(x for x in decoding if x["size"] == d["size"] and x["system"] == "reference")[
            "output_tokens_per_s"
        ]
        lines.append(
            f"| {d['size']} (beam search, output tok/s) | {d['system'][len(UNDONE) :]} | {d['output_tokens_per_s']:,.0f} | "
            f"{after:,.0f} | {after / d['output_tokens_per_s']:.2f}x |"
        )
    return lines


def decoding_table(meta: dict, decoding: list[dict]) -> list[str]:
    """One row per system's beam search on the same sources, each beside the reference at its size."""
    counts = ", ".join(f"{d['sentences']} at {d['size']}" for d in decoding if d["system"] == "reference")
    lines = [
        "",
        "## Beam search (beam 4, batched)",
        "",
        f"The same dev sources for every system ({counts}), "
        f"cut to {meta['decode_length']} tokens; every system is forced to "
        f"{meta['decode_length'] + meta['extra']} output tokens per sentence (untrained weights; the reference stops at "
        "source length + 50 and rarely ends earlier), the same thread count for all.",
        "",
        "| size | system | threads | s (median) | output tok/s | vs reference |",
        "|---|---|---|---|---|---|",
    ]
    dref = {d["size"]: d for d in decoding if d["system"] == "reference"}
    for d in decoding:
        lines.append(
            f"| {d['size']} | {d['system']} | {d['threads']} | {d['s']:.2f} | {d['output_tokens_per_s']:,.0f} | "
            f"{d['output_tokens_per_s'] / dref[d['size']]['output_tokens_per_s']:.2f}x |"
        )
    return lines
