"""The training loss's peak memory: the whole logits (the protocol's forward, then `loss`) against the chunked
pre-softmax loss (`model.objective.linear_label_smoothed_loss`), at the base model's width and vocabulary.

    python -m ablations.bench.loss_memory                      # d_model 512, 37,000 words, 25,000 target positions
    python -m ablations.bench.loss_memory --positions 4000     # a smaller batch, faster

Each way runs forward and backward of the loss alone (the decoder's output in, the gradients of it and of the
embedding matrix out) in a process of its own, on the CPU in float32, and reports the growth of that process's peak
resident memory over its inputs: what the loss adds to a training step's peak.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from model.objective import label_smoothed_loss, linear_label_smoothed_loss
from ablations.runs.options import failed
from plumbing.cli import OneLineParser, check_counts

WAYS = ("whole logits", "chunked")


def peak_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one_way(way: str, positions: int, d_model: int, vocab: int) -> dict[str, float]:
    """Forward and backward of the loss by `way`; the peak's growth over the inputs, the time and the loss."""
    torch.manual_seed(0)
    hidden = torch.randn(positions, d_model, requires_grad=True)
    weight = (torch.randn(vocab, d_model) * d_model**-0.5).requires_grad_()
    target = torch.randint(1, vocab, (positions,))
    before, start = peak_bytes(), time.perf_counter()
    if way == "chunked":
        loss = linear_label_smoothed_loss(hidden, weight, target, 0, 0.1)
    else:
        loss = label_smoothed_loss(hidden @ weight.T, target, 0, 0.1)
    loss.backward()
    return {
        "way": way,
        "peak_growth_gb": (peak_bytes() - before) / 1e9,
        "seconds": time.perf_counter() - start,
        "loss": loss.item(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m ablations.bench.loss_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--positions", type=int, default=25_000, help="target positions in the batch")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=37_000, help="the paper's shared BPE vocabulary (section 5.1)")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in the child process
    args = parser.parse_args(argv)
    try:
        check_counts(("--positions", args.positions), ("--d-model", args.d_model), ("--vocab", args.vocab))
    except ValueError as exc:
        return failed(exc)
    if args.way:
        print(json.dumps(one_way(args.way, args.positions, args.d_model, args.vocab)))
        return 0
    sizes = ["--positions", str(args.positions), "--d-model", str(args.d_model), "--vocab", str(args.vocab)]
    print(f"positions {args.positions}, d_model {args.d_model}, vocabulary {args.vocab}, float32, CPU")
    print("| way | peak memory added (GB) | forward + backward (s) | loss |\n|---|---:|---:|---:|")
    for way in WAYS:
        child = [sys.executable, "-m", "ablations.bench.loss_memory", *sizes, "--way", way]
        row = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
        print(f"| {way} | {row['peak_growth_gb']:.2f} | {row['seconds']:.1f} | {row['loss']:.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
