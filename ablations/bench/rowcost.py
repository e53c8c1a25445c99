"""What a grid costs before it runs: seconds per training step of every Table 3 row under a budget, relative to base.

    python -m ablations.bench.rowcost --budget cpu     # 1 thread, random batches of the budget's size, 20 timed steps

Multiply by the budget's steps and base's measured step time to plan a grid (README, "The cpu budget").
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from ablations.data.batching import BatchStream
from ablations.runs.budgets import BUDGETS, budget, row_config, select_rows
from ablations.training.train import loss_of, make_optimizer, train_step
from model import TransformerConfig, load_model


def step_seconds(config: TransformerConfig, batches: list, warmup: int) -> float:
    """Mean seconds of one optimizer step over batches[warmup:] (the first steps warm allocator and caches)."""
    model = load_model("reference", config=config).train()
    optimizer = make_optimizer(model, torch.device("cpu"))
    for i, batch in enumerate(batches):
        if i == warmup:
            start = time.perf_counter()
        train_step(model, loss_of(model), optimizer, [batch], 1e-3)
    return (time.perf_counter() - start) / (len(batches) - warmup)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablations.bench.rowcost", description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="cpu", choices=list(BUDGETS))
    p.add_argument("--rows", default="all")
    p.add_argument("--steps", type=int, default=20, help="timed steps per row (default 20, after 5 untimed)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    b, vocab = budget(args.budget), 2000
    rng = random.Random(0)
    pairs = [[rng.randint(4, vocab - 1) for _ in range(rng.randint(5, 25))] for _ in range(8000)]
    stream = BatchStream(pairs[:4000], pairs[4000:], b.batch_tokens, 1)
    batches = [stream.next() for _ in range(5 + args.steps)]
    costs: dict[str, float] = {}
    for row in select_rows(args.rows):
        torch.manual_seed(0)
        costs[row.name] = step_seconds(row_config(row, b, vocab), batches, 5)
        first = next(iter(costs.values()))
        print(
            f"{row.name:>5}  {costs[row.name] * 1000:7.1f} ms/step  {costs[row.name] / first:5.2f} x {next(iter(costs))}",
            flush=True,
        )
    print(f"all {len(costs)} rows: {sum(costs.values()) / next(iter(costs.values())):.1f} x {next(iter(costs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
