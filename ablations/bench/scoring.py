"""The training loss's work on one chunk of logits (softmax, loss and gradient), eager against compiled.

    python -m ablations.bench.scoring                                   # the CPU: 1,048 rows of 16,000 words
    python -m ablations.bench.scoring --device cuda --vocab 37000       # a GPU, the paper's vocabulary

`model.objective.linear_label_smoothed_loss` makes the logits a chunk at a time (`CHUNK_LOGITS`) and scores each
chunk by `chunk_scores`. Eager, that is a dozen passes over the chunk's logits (casts, maximum, log-sum-exp, softmax,
gradient); the CPU's C++ kernel does it in two; a compiled training step (ablations/training/compiling.py) runs it as
torch.compile compiles it. Times the three on the same logits, in float32 and in bf16 (the logits of a step in bf16
weights), after one untimed call (the compile), and reports each way's loss and gradient against eager torch ops.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch

from ablations.runs.options import failed
from ablations.training.compiling import compiled_scorer
from model import kernels
from model.objective import CHUNK_LOGITS, chunk_scores, chunk_scores_by_torch_ops
from plumbing.cli import OneLineParser, check_counts, resolve_device

DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Seconds a call of `fn`, the mean of `repeats` after one untimed call (waiting for the GPU at both ends)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats


def rows_of(dtype: str, rows: int, vocab: int, device: torch.device, repeats: int) -> list[str]:
    """The table's rows for one dtype: each way's time per chunk, its speed against eager, its loss and its largest
    gradient difference from eager's, relative to eager's largest gradient."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(device, DTYPES[dtype])  # logits of a trained model's spread
    target = torch.randint(1, vocab, (rows,), generator=g).to(device)
    share = torch.full((rows,), 1.0 / rows, device=device)
    ways = {"eager torch ops": chunk_scores_by_torch_ops}
    if kernels.takes_loss(logits.float()):
        ways["the CPU's C++ kernel"] = chunk_scores
    ways["compiled (inductor)"] = compiled_scorer("inductor")
    loss, grad = chunk_scores_by_torch_ops(logits, target, share, 0.1, True)
    lines, eager_s = [], None
    for name, score in ways.items():
        start = time.perf_counter()
        their_loss, their_grad = score(logits, target, share, 0.1, True)  # the first call: compiles, if it does
        first_s = time.perf_counter() - start
        seconds = timed(lambda s=score: s(logits, target, share, 0.1, True), repeats, device)
        eager_s = eager_s or seconds
        apart = (their_grad.float() - grad.float()).abs().max() / grad.float().abs().max()
        lines.append(
            f"| {name} | {dtype} | {seconds * 1e3:.2f} | {eager_s / seconds:.2f}x | {first_s:.1f} | "
            f"{their_loss.item():.6f} (eager {loss.item():.6f}) | {apart.item():.1e} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m ablations.bench.scoring", description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=16_000, help="words (default 16,000: the short budget's BPE)")
    parser.add_argument("--rows", type=int, help="rows a chunk (default: as many as CHUNK_LOGITS holds)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each way (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    args = parser.parse_args(argv)
    try:
        rows = args.rows if args.rows is not None else max(1, CHUNK_LOGITS // max(args.vocab, 1))
        check_counts(("--vocab", args.vocab), ("--rows", rows), ("--repeats", args.repeats))
        device = resolve_device(args.device)
    except ValueError as exc:
        return failed(exc)
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core, as every CPU number in docs/benchmark.md
    print(f"one chunk of {rows} rows x {args.vocab} words, {device.type}, mean of {args.repeats} calls after one")
    print(
        "| way | logits | ms a chunk | vs eager | first call s | loss | gradient vs eager (max, relative) |\n"
        "|---|---|---:|---:|---:|---|---:|"
    )
    for dtype in DTYPES:
        print("\n".join(rows_of(dtype, rows, args.vocab, device, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
