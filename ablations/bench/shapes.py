"""How many distinct batch shapes a budget's training stream meets, and what padding them to a multiple costs.

    python -m ablations.bench.shapes --budget short --steps 1000 --pad-multiples 1,8
    python -m ablations.bench.shapes --budget cpu --steps 1000 --pad-multiples 1,8 --time 100
    python -m ablations.bench.shapes --budget short --steps 300 --time 300 --device cuda   # bf16, eager, on a GPU
    python -m ablations.bench.shapes --budget short --steps 1000 --pad-multiples 1,8 --pack  # packed rows beside
    python -m ablations.bench.shapes --budget short --steps 50 --pad-multiples 8 --pack --compiles  # graphs compiled

Each new shape costs a compiled model a recompile and cuDNN's attention a new execution plan (docs/benchmark.md,
"On a GPU"). Reads the budget's real training stream (its data preset, BPE and batch size); `--time N` also times N
training steps of the budget's base row at each multiple (in the budget's precision on a GPU), interleaved, on the
same batches, and reports real (non-pad) tokens per second. `--compiles` counts the graphs that the runner's compile
makes over each stream's steps (the stream's first batch with equal source and target lengths put first, where duck
sizing would have tied them): dynamo's eager backend on the CPU, which traces and guards as inductor does, a narrow
model of the base row's layers in bf16 weights, and the GPU's attention choices made on the CPU
(ablations/bench/launches.py). The padding floor is the share that no batching goes under at that
multiple (`padding_floor`). `--pack` adds each multiple's packed stream (several pairs per row, as `short` and `paper`
train on a GPU; its floor is then that of the rows as packed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from ablations.data.batching import BatchStream, round_up
from ablations.data.corpora import data_dir
from ablations.grid.runner import describe_device, prepare_data
from ablations.bench.launches import on_a_gpu
from ablations.runs.budgets import (
    BF16_WEIGHTS,
    BUDGETS,
    budget,
    precision_on,
    row_config,
    select_rows,
    step_autocast,
)
from ablations.runs.options import failed
from ablations.training.backends import sdpa_backend
from ablations.training.compiling import compile_model, compiles
from ablations.training.precision import for_training
from ablations.training.train import loss_of, make_optimizer, train_step
from model import TransformerConfig, load_model
from model.batch import Batch
from plumbing.cli import check_counts, resolve_device
from plumbing.stopping import stops_cleanly


def stream_shapes(batches: list[Batch]) -> dict[str, float]:
    """Distinct (rows, source length, target length) shapes, and padding's share of the positions, over `batches`."""
    positions = sum(b.src.numel() + b.tgt.numel() for b in batches)
    real = sum(b.src_tokens + b.tgt_tokens for b in batches)
    return {
        "shapes": len({(*b.src.shape, b.tgt.shape[1]) for b in batches}),
        "lengths": len({(b.src.shape[1], b.tgt.shape[1]) for b in batches}),
        "padding": 1 - real / positions,
        "real_tokens_per_step": real / len(batches),
    }


def padding_floor(batches: list[Batch], multiple: int) -> float:
    """The padding share no batching of these rows goes under at `multiple`: a batch's lengths are multiples of it,
    so each row holds at least its own source and target lengths rounded up."""
    real = sum(b.src_tokens + b.tgt_tokens for b in batches)
    rounded = sum(int(round_up((~pad).sum(1), multiple).sum()) for b in batches for pad in (b.src_pad, b.tgt_pad))
    return 1 - real / rounded


def step_times(
    batches_by_stream: dict[tuple[int, bool], list[Batch]],
    config: TransformerConfig,
    device: torch.device,
    precision: str,
    warmup: int = 5,
) -> dict[tuple[int, bool], tuple[float, float]]:
    """(median seconds of a training step, real tokens per second) at each (multiple, packed) stream, the streams
    interleaved step by step, one model each, in `precision` (ablations/training/precision.py); reading the loss back
    waits for the device, so each step is timed whole."""
    systems = {}
    for stream in batches_by_stream:
        torch.manual_seed(0)
        model = load_model("reference", config=config).to(device).train()
        forward, optimizer = for_training(model, make_optimizer(model, device), precision)
        systems[stream] = (model, forward, optimizer, [], [0])
    steps = min(len(b) for b in batches_by_stream.values())
    for i in range(steps):
        for stream, (model, forward, optimizer, times, tokens) in systems.items():
            batch = batches_by_stream[stream][i].to(device)
            started = time.perf_counter()
            train_step(forward, loss_of(model), optimizer, [batch], 1e-4, step_autocast(precision)).item()
            if i >= warmup:
                times.append(time.perf_counter() - started)
                tokens[0] += batch.src_tokens + batch.tgt_tokens
    return {m: (statistics.median(times), tokens[0] / sum(times)) for m, (*_, times, tokens) in systems.items()}


def equal_lengths_first(batches: list[Batch]) -> tuple[list[Batch], bool]:
    """The batches with the first whose source and target lengths are equal moved to the front, and whether there
    was one."""
    equal = next((i for i, b in enumerate(batches) if b.src.shape[1] == b.tgt.shape[1]), None)
    if equal is None:
        return batches, False
    return [batches[equal], *batches[:equal], *batches[equal + 1 :]], True


def graphs_compiled(batches: list[Batch], config: TransformerConfig) -> str:
    """Graphs the runner's compile makes over training steps on `batches` (`equal_lengths_first`), the GPU's path made
    on the CPU (bf16 weights, its attention choices) and traced by dynamo's eager backend (2, the forward's and the
    loss's chunk scoring: no recompile), and whether the first batch's lengths were equal."""
    ordered, equal = equal_lengths_first(batches)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = load_model("reference", config=config).train()
    forward, optimizer = for_training(model, make_optimizer(model, torch.device("cpu")), BF16_WEIGHTS)
    forward = compile_model(forward, backend="eager")
    before = compiles()
    with on_a_gpu(stacked=True, causal=True):
        for batch in ordered:
            train_step(forward, loss_of(model), optimizer, [batch], 1e-4)
    return f"{compiles() - before} ({'the first batch S = T' if equal else 'no batch with S = T'})"


@stops_cleanly("nothing was written; run it again")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablations.bench.shapes", description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="short", choices=list(BUDGETS))
    p.add_argument("--steps", type=int, default=1000, help="training steps of the stream to read (default 1000)")
    p.add_argument("--pad-multiples", default="1,8", help="comma list of pad multiples (default 1,8)")
    p.add_argument("--pack", action="store_true", help="also read each multiple's packed stream")
    p.add_argument("--time", type=int, default=0, help="also time this many base-row steps per multiple")
    p.add_argument("--compiles", action="store_true", help="also count the graphs compiled over each stream's steps")
    p.add_argument("--device", default="cpu", help="where --time trains: cpu, cuda, cuda:N (default cpu)")
    p.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    p.add_argument("--runs", default="runs", help="where the BPE cache lives (default runs)")
    args = p.parse_args(argv)
    try:
        multiples = [int(m) for m in args.pad_multiples.split(",")]
        check_counts(("--steps", args.steps), *(("--pad-multiples", m) for m in multiples))
        b = budget(args.budget)
        device = resolve_device(args.device)
        data = prepare_data(b, b.preset, data_dir(args.data), Path(args.runs))
    except ValueError as exc:
        return failed(exc)
    micro = max(1, b.batch_tokens // b.accumulation)
    lines = [
        f"`python -m ablations.bench.shapes {' '.join(argv if argv is not None else sys.argv[1:])}`: the first "
        f"{args.steps} steps of budget {b.name} ({data.summary}; {micro} positions per side per batch)",
        "",
        "| pad multiple | distinct shapes | distinct (S, T) | padding share | real tokens per step |"
        + (f" step s on {describe_device(device)} (median) | real tokens/s |" if args.time else "")
        + (" graphs compiled |" if args.compiles else "")
        + " padding floor (rows rounded alone) |",
        "|---|---|---|---|---|" + ("---|---|" if args.time else "") + ("---|" if args.compiles else "") + "---|",
    ]
    batches = {}  # by (multiple, packed)
    for m, pack in [(m, pack) for m in multiples for pack in ((False, True) if args.pack else (False,))]:
        stream = BatchStream(data.train_src, data.train_tgt, micro, seed=1, pad_multiple=m, pack=pack)
        batches[m, pack] = [stream.next() for _ in range(args.steps)]
    config = row_config(select_rows("base")[0], b, data.sp.get_piece_size())
    precision = precision_on(b, device)
    with sdpa_backend(b.sdpa_backend if device.type == "cuda" else "default"):  # the budget's kernel, as a run's
        few = {key: bs[: args.time] for key, bs in batches.items()}
        timed = step_times(few, config, device, precision) if args.time else {}
    narrow = config.replace(N=1, d_model=64, d_ff=128, d_k=8, d_v=8)  # the graphs do not depend on the widths
    graphs = {key: graphs_compiled(bs, narrow) for key, bs in batches.items()} if args.compiles else {}
    for (m, pack), stream in batches.items():
        s = stream_shapes(stream)
        lines.append(
            f"| {m}{' packed' if pack else ''} | {s['shapes']:.0f} | {s['lengths']:.0f} | {s['padding']:.1%} | {s['real_tokens_per_step']:.0f} |"
            + (f" {timed[m, pack][0]:.4f} | {timed[m, pack][1]:,.0f} |" if timed else "")
            + (f" {graphs[m, pack]} |" if graphs else "")
            + f" {padding_floor(stream, m):.1%} |"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
