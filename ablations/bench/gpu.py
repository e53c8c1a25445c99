"""`python -m ablations.bench.gpu --device cuda` (nox -s bench_gpu): the training step of the reference, the
torch.nn.Transformer adapter and HF MarianMT on one GPU, eager and compiled, bf16 autocast and fused Adam, at the
base and big sizes of the short budget; attention backends against each other; beam search beside HF generate.

Every system trains on the same real training batches of the short budget (its data and BPE, lengths as they come,
padded to multiples of 8 as the runner pads them), repetitions interleaved across systems. Step times are reported
as p50/p99/max with warm-up and compiling apart, and MFU against the card's bf16 dense peak. `--device cpu --sizes
tiny` runs the same code in seconds (fp32, no MFU: there is no bf16 peak to hold a CPU to). Writes
reports/bench-gpu.md and reports/bench-gpu.json; docs/benchmark.md ("On a GPU") says what is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ablations.bench.gpu_report import markdown
from ablations.bench.gpu_timing import (
    MODES,
    SYSTEMS,
    Deadline,
    build_entries,
    build_searches,
    time_decoding,
    time_steps,
    training_rows,
    warm_up,
)
from ablations.bench.measure import fixed_length_sources
from ablations.bench.report import machine, output_path, shown_args
from ablations.bench.shapes import stream_shapes
from ablations.data.batching import BatchStream
from ablations.data.corpora import data_dir
from ablations.grid.runner import PreparedData, describe_device, peak_flops, prepare_data
from ablations.runs.budgets import budget, row_config, select_rows
from ablations.runs.options import FORESEEN, OneLineParser, check_counts, failed, resolve_device
from ablations.training.backends import SDPA_BACKENDS
from ablations.training.stopping import stops_cleanly
from model.files import write_atomic

# A size: the budget whose data, BPE, batch size and scale it takes, and the Table 3 row it trains.
SIZES = {"base": ("short", "base"), "big": ("short", "big"), "tiny": ("smoke", "base")}


@dataclass(frozen=True)
class BenchOptions:
    """What to measure, every value checked; the defaults differ by device (see `parse`)."""

    device: torch.device
    sizes: tuple[str, ...]
    systems: tuple[str, ...]
    modes: tuple[str, ...]
    backend: str  # attention backend of every mode's entry
    backends: tuple[str, ...]  # compared with it, eager
    precision: str  # bf16 (autocast) or fp32
    steps: int
    warmup: int
    batch_tokens: int | None  # None: the size's budget's
    pad_multiple: int | None  # None: the size's budget's
    compile_backend: str
    decode_sentences: int
    decode_length: int
    extra: int
    decode_reps: int
    time_limit: float | None
    data: Path
    runs: Path
    out: Path
    args: str

    @property
    def autocast(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None


def choose(flag: str, text: str, allowed: tuple[str, ...], empty: bool = False) -> tuple[str, ...]:
    """A comma list of names from `allowed`, each once; a one-line ValueError naming the flag otherwise."""
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    wrong = [c for c in chosen if c not in allowed]
    if wrong or not (chosen or empty):
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(allowed)}" + (" (or nothing)" if empty else ""))
    return chosen


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations.bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    p.add_argument("--runs", default="runs", help="where the BPE cache lives (default runs)")
    p.add_argument("--sizes", help=f"{', '.join(SIZES)} (default base,big on a GPU, tiny on the CPU)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"default {','.join(SYSTEMS)}")
    p.add_argument("--modes", help="eager, compiled (default both on a GPU, eager on the CPU)")
    p.add_argument("--backend", help="attention backend of every mode (default efficient on a GPU, as the runner)")
    p.add_argument("--backends", help="backends compared with it, eager (default all on a GPU, none on the CPU)")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="default bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--steps", type=int, default=20, help="timed steps per entry (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps per entry (default 3)")
    p.add_argument("--batch-tokens", type=int, help="positions per side per step (default: the size's budget's)")
    p.add_argument("--pad-multiple", type=int, help="pad lengths to a multiple of this (default: the budget's)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (default inductor)")
    p.add_argument("--decode-sentences", type=int, help="sources to beam-search (default 32; 4 on the CPU)")
    p.add_argument("--decode-length", type=int, help="tokens per source (default 20; 8 on the CPU)")
    p.add_argument("--extra", type=int, help="output tokens beyond the source (default 50; 10 on the CPU)")
    p.add_argument("--decode-reps", type=int, default=3, help="timed beam searches per system (default 3)")
    p.add_argument("--time-limit", type=float, help="seconds: start no new work after it (default none)")
    p.add_argument("--out", default=str(Path("reports") / "bench-gpu.md"))
    return p


def parse(argv: list[str]) -> BenchOptions:
    """The options, checked before any work: a one-line ValueError (or DataError) naming the flag and the fix."""
    a = parser().parse_args(argv)
    check_counts(
        ("--steps", a.steps),
        ("--warmup", a.warmup),
        ("--batch-tokens", a.batch_tokens),
        ("--pad-multiple", a.pad_multiple),
        ("--decode-sentences", a.decode_sentences),
        ("--decode-length", a.decode_length),
        ("--extra", a.extra),
        ("--decode-reps", a.decode_reps),
    )
    if a.time_limit is not None and not a.time_limit > 0:
        raise ValueError(f"--time-limit {a.time_limit}: give a number of seconds above 0")
    device = resolve_device(a.device)
    gpu = device.type == "cuda"
    backend = choose("--backend", a.backend or ("efficient" if gpu else "default"), SDPA_BACKENDS)
    if len(backend) != 1:
        raise ValueError(f"--backend {a.backend!r}: give one of {', '.join(SDPA_BACKENDS)}")
    all_backends = ",".join(SDPA_BACKENDS) if gpu else ""
    return BenchOptions(
        device=device,
        sizes=choose("--sizes", a.sizes or ("base,big" if gpu else "tiny"), tuple(SIZES)),
        systems=choose("--systems", a.systems, tuple(SYSTEMS)),
        modes=choose("--modes", a.modes or ("eager,compiled" if gpu else "eager"), MODES),
        backend=backend[0],
        backends=choose("--backends", all_backends if a.backends is None else a.backends, SDPA_BACKENDS, empty=True),
        precision=a.precision or ("bf16" if gpu else "fp32"),
        steps=a.steps,
        warmup=a.warmup,
        batch_tokens=a.batch_tokens,
        pad_multiple=a.pad_multiple,
        compile_backend=a.compile_backend,
        decode_sentences=a.decode_sentences or (32 if gpu else 4),
        decode_length=a.decode_length or (20 if gpu else 8),
        extra=a.extra or (50 if gpu else 10),
        decode_reps=a.decode_reps,
        time_limit=a.time_limit,
        data=data_dir(a.data),
        runs=Path(a.runs),
        out=output_path(a.out),
        args=shown_args(argv),
    )


def batches_of(size: str, data: PreparedData, o: BenchOptions) -> tuple[list, dict]:
    """warmup + steps training batches of the size's budget, on the device, and what they hold (for the report)."""
    b = budget(SIZES[size][0])
    tokens, pad = o.batch_tokens or b.batch_tokens, o.pad_multiple or b.pad_multiple
    stream = BatchStream(data.train_src, data.train_tgt, tokens, seed=0, pad_multiple=pad)
    batches = [stream.next() for _ in range(o.warmup + o.steps)]
    timed = batches[o.warmup :]
    about = {
        "size": size,
        "preset": data.preset,
        "vocab": data.sp.get_piece_size(),
        "batch_tokens": tokens,
        "pad_multiple": pad,
        **stream_shapes(timed),
        "mean_tgt_tokens": sum(x.tgt_tokens for x in timed) / len(timed),
    }
    batches = [x.to(o.device) for x in batches]
    for x in batches:  # counted now: the first step to read them would otherwise wait for the GPU
        x.src_tokens, x.tgt_tokens
    return batches, about


def measure_size(size: str, data: PreparedData, o: BenchOptions, deadline: Deadline) -> tuple[list, list, list, dict]:
    """One size's training and decoding rows, notes, and what its batches hold."""
    b, row = budget(SIZES[size][0]), select_rows(SIZES[size][1])[0]
    cfg = row_config(row, b, data.sp.get_piece_size())
    batches, about = batches_of(size, data, o)
    entries, models, notes = build_entries(
        cfg, o.systems, o.modes, o.backend, o.backends, o.device, o.autocast, o.compile_backend
    )
    warm_up(entries, batches[: o.warmup], o.device, deadline, o.backend)
    about["timed_reps"] = time_steps(entries, batches[o.warmup :], o.device, deadline)
    training, built = training_rows(size, entries, peak_flops(o.device) if o.precision == "bf16" else None), set(models)
    del entries, models  # the GPU's memory for the decoding models
    if o.device.type == "cuda":
        torch.cuda.empty_cache()
    src = fixed_length_sources(data.dev_src, o.decode_sentences, o.decode_length).to(o.device)
    searches = build_searches(cfg, built, src, o.extra, o.autocast, o.device)
    decoding = time_decoding(size, searches, o.decode_reps, o.backend, o.device, deadline)
    return training, decoding, [f"{size}: {n}" for n in notes], about


@stops_cleanly("nothing written (an earlier report is as it was); run the same command again")
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the time limit counts reading the data too
    argv = sys.argv[1:] if argv is None else argv
    try:
        o = parse(argv)
        data = {}
        for size in o.sizes:
            name = SIZES[size][0]
            if name not in data:
                data[name] = prepare_data(budget(name), budget(name).preset, o.data, o.runs)
            fixed_length_sources(data[name].dev_src, o.decode_sentences, o.decode_length)  # enough sources, or say so
    except FORESEEN as exc:  # a bad flag value, a missing data folder: one line
        return failed(exc)
    deadline = Deadline(o.time_limit, started)
    if o.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as the runner
    meta = {
        **machine(),
        "device": describe_device(o.device),
        "peak_bf16_flops": peak_flops(o.device),
        "precision": o.precision,
        "systems": list(o.systems),
        "modes": list(o.modes),
        "backend": o.backend,
        "backends": list(o.backends),
        "compile_backend": o.compile_backend,
        "warmup": o.warmup,
        "steps": o.steps,
        "decode": {"sentences": o.decode_sentences, "length": o.decode_length, "extra": o.extra, "reps": o.decode_reps},
        "time_limit": o.time_limit,
        "args": o.args,
    }
    training, decoding, notes, batches = [], [], [], []
    for size in o.sizes:
        rows, searches, lines, about = measure_size(size, data[SIZES[size][0]], o, deadline)
        training, decoding, notes, batches = training + rows, decoding + searches, notes + lines, batches + [about]
        if o.device.type == "cuda":
            torch.cuda.empty_cache()
        torch._dynamo.reset()  # the next size's models compile afresh, not against this size's cache limit
    meta["batches"] = batches
    write_atomic(o.out, markdown(meta, training, decoding, notes))
    write_atomic(
        o.out.with_suffix(".json"),
        json.dumps({**meta, "training": training, "decoding": decoding, "notes": notes}, indent=2) + "\n",
    )
    print(o.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
