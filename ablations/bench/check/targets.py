"""The GPU targets of docs/benchmark.md judged on what the GPU check measured: one table row per target, with the
number, the bar and the verdict. A target whose numbers are missing says "not measured"; none is met by default."""

from __future__ import annotations

import statistics

MFU_BAR = 0.35  # the reference's training step at the base size, against the card's bf16 dense peak
PEER_BAR = 1.5  # the reference's training step against HF Marian's fastest in the same mode, same batches
BEAM_BAR = 2.0  # beam search against HF generate
STALL_BAR = 3.0  # after WARM_STEPS, no step longer than this many times the median step
WARM_STEPS = 20
HEADER = ["| target | measured | bar | verdict |", "|---|---|---|---|"]


def verdict(value: float | None, bar: float) -> str:
    return "not measured" if value is None else "met" if value >= bar else "not met"


def row(target: str, measured: str, bar: str, judged: str) -> str:
    return f"| {target} | {measured} | {bar} | {judged} |"


def fastest(rows: list[dict], **match: str) -> dict | None:
    """The measured row of highest target tokens/s among those whose fields equal `match`."""
    found = [r for r in rows if r.get("tgt_tokens_per_s") and all(r.get(k) == v for k, v in match.items())]
    return max(found, key=lambda r: r["tgt_tokens_per_s"], default=None)


def why_not(rows: list[dict], **match: str) -> str:
    """Why the row matching `match` has no rate: its status, or that there is no such row."""
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[0].get("status", "no rate") if found else "no such row"


def ratio_row(size: str, rows: list[dict], mode: str, backend: str) -> str:
    """The reference's tokens/s in `mode` at the runner's backend over HF Marian's fastest in the same mode and at
    the same precision: an eager step against an eager one, a compiled against a compiled, autocast against autocast,
    never across (a compile's gain, or bf16 weights', is not the model's)."""
    peer = fastest(rows, system="hf-marian", mode=mode)
    same = {"precision": peer["precision"]} if peer and "precision" in peer else {}
    ours = fastest(rows, system="reference", mode=mode, backend=backend, **same)
    against = f"HF Marian {mode}" + (f", {peer['backend']}" if peer else "")
    target = f"{size}: training tokens/s ({mode}, {backend}) over {against}"
    if ours and peer:
        ratio = ours["tgt_tokens_per_s"] / peer["tgt_tokens_per_s"]
        return row(target, f"{ratio:.2f}x", f">= {PEER_BAR}x", verdict(ratio, PEER_BAR))
    missing = [f"reference: {why_not(rows, system='reference', mode=mode, backend=backend)}"] if not ours else []
    missing += [f"HF Marian: {why_not(rows, system='hf-marian', mode=mode)}"] if not peer else []
    return row(target, f"- ({'; '.join(missing)})", f">= {PEER_BAR}x", "not measured")


def bench_targets(bench: dict) -> list[str]:
    """MFU of the reference at the attention backend the runner uses, at its fastest mode and precision; its
    tokens/s over HF Marian's mode by mode (ratio_row); and beam search against HF generate, per size."""
    lines = []
    for size in dict.fromkeys(r["size"] for r in bench["training"]):
        rows = [r for r in bench["training"] if r["size"] == size]
        ours = fastest(rows, system="reference", backend=bench["backend"])
        how = ", ".join(str(ours[k]) for k in ("mode", "backend", "precision") if k in ours) if ours else "-"
        mfu = ours.get("mfu") if ours else None
        lines.append(
            row(
                f"{size}: training step MFU ({how})",
                "-" if mfu is None else f"{mfu:.1%}",
                f">= {MFU_BAR:.0%}",
                verdict(mfu, MFU_BAR),
            )
        )
        lines += [ratio_row(size, rows, mode, bench["backend"]) for mode in dict.fromkeys(r["mode"] for r in rows)]
    for size in dict.fromkeys(r["size"] for r in bench["decoding"]):
        rates = {r["system"]: r.get("output_tokens_per_s") for r in bench["decoding"] if r["size"] == size}
        ours, peer = rates.get("reference beam_search"), rates.get("HF MarianMT generate")
        ratio = ours / peer if ours and peer else None
        lines.append(
            row(
                f"{size}: beam search output tokens/s over HF generate",
                "-" if ratio is None else f"{ratio:.2f}x",
                f">= {BEAM_BAR}x",
                verdict(ratio, BEAM_BAR),
            )
        )
    return lines


def runner_targets(metrics: list[dict], final: dict) -> list[str]:
    """No stall after warm-up: the longest step of the logged windows that begin at or after WARM_STEPS, compiling
    steps included (a recompile mid-run is a stall), against the median of the windows' median steps. A log from
    before step_s_max_all was written holds only the steps that compiled nothing; the row says so. The 1000-step row
    is projected from the median step, not judged."""
    timed = [m for m in metrics if m.get("step_s_p50") is not None]
    median = statistics.median(m["step_s_p50"] for m in timed) if timed else None
    windows = list(zip([0, *(m["step"] for m in metrics)], metrics))  # (the step a window follows, its record)
    later = [(begins, m) for begins, m in windows if begins >= WARM_STEPS]
    every = all("step_s_max_all" in m for _, m in later)
    key, which = ("step_s_max_all", "compiling ones included") if every else ("step_s_max", "compiling ones not logged")
    longest = max((m[key] for _, m in later if m.get(key) is not None), default=None)
    target = f"runner: longest step after step {later[0][0] if later else WARM_STEPS} ({which}) / median step"
    if longest is None or median is None:
        stall = row(target, "-", f"<= {STALL_BAR}x", "not measured")
    else:
        stall = row(
            target,
            f"{longest / median:.2f}x ({longest * 1e3:.0f} / {median * 1e3:.0f} ms)",
            f"<= {STALL_BAR}x",
            "met" if longest <= STALL_BAR * median else "not met",
        )
    if median is None or not final.get("steps"):
        return [stall]
    projected = 1000 * median + (final.get("compile_s") or 0)
    return [
        stall,
        row(
            "runner: 1000 steps of the base row",
            f"projected {projected:.0f} s of training (1000 x the median step, plus compiling); the check ran "
            f"{final['steps']} steps in {final.get('wall_s') or 0:.0f} s, scoring {final.get('eval_s') or 0:.0f} s",
            "scoring included, <= 180 s",
            "not judged: a projection, and scoring here is of few dev pairs",
        ),
    ]
