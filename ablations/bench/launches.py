"""How many kernels a training step and a beam-search step launch on a GPU, counted on the CPU, before and after each
of the GPU path's choices.

    python -m ablations.bench.launches              # the base model (N=6), a batch of 8 pairs, 2 decoding steps

A GPU step of the reference at base size is bound by the host where it launches many small kernels (docs/benchmark.md,
"On a GPU"). Each operator that does work launches at least one kernel; views and allocations launch none. This counts
such operators at torch's dispatcher (below autograd, so the backward pass too) in one step, with the GPU's choices
made on the CPU as the tests force them (tests/model/test_gpu_paths.py): the count, not the time, is what carries over.
Fused Adam is one operator here and a few multi-tensor kernels on a GPU.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablations.data.batching import make_batch
from ablations.data.bpe import EOS, PAD
from ablations.scoring import decoding
from ablations.scoring.decoding import beam_search
from ablations.runs.budgets import step_autocast
from ablations.training.precision import for_training
from ablations.training.train import loss_of, make_optimizer, train_step
from model import Transformer, TransformerConfig, attention, transformer
from model.batch import Batch
from model.params import working_copy
from plumbing.cli import OneLineParser

ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "lift_fresh"}


@dataclass(frozen=True)
class Choices:
    """The reference's GPU choices, as a row of the table takes them."""

    name: str
    stacked: bool  # Q, K, V as one product (model.attention.fuses_projections)
    causal: bool  # the causal kernel for right-padded targets (Transformer.causal_by_kernel)
    bf16_weights: bool  # training: a bf16 working copy and fp32 master weights; search: a bf16 copy; else autocast
    replayed: bool = False  # search: at fixed shapes, each step after the second a CUDA graph's replay


CHOICES = (  # cumulatively
    Choices("before: projections apart, masked decoder self-attention, bf16 autocast", False, False, False),
    Choices("stacked projections", True, False, False),
    Choices("stacked projections, the causal kernel", True, True, False),
    Choices("stacked projections, the causal kernel, bf16 weights", True, True, True),
    Choices("the same, search steps replayed as a CUDA graph", True, True, True, replayed=True),
)


class Launches(TorchDispatchMode):
    """Counts the operators dispatched while active that do work on a device: not views, not bare allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.paused = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and not func.is_view and func.overloadpacket.__name__ not in ALLOCATIONS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def launches(fn: Callable[[], object]) -> int:
    """Operators that do work in one call of `fn`."""
    with Launches() as counted:
        fn()
    return counted.count


def replayed_as_one(counted: Launches) -> Callable:
    """`ablations.scoring.graphs.captured` as the CPU can take it: the step taken, then each replay's step run
    uncounted and counted as the one launch of a graph's replay."""

    def captured(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
        step()

        def replay() -> None:
            counted.paused = True
            try:
                step()
            finally:
                counted.paused = False
            counted.count += 1

        return replay

    return captured


def on_a_gpu(stacked: bool, causal: bool) -> ExitStack:
    """The GPU's choices made on the CPU: torch's fused attention everywhere (not the CPU's explicit path or kernels),
    the stacked projections and the causal kernel as asked."""
    stack = ExitStack()
    stack.enter_context(mock.patch.object(attention, "explicit_is_faster", lambda q, k: False))
    stack.enter_context(mock.patch.object(attention.kernels, "applies", lambda *args: False))
    stack.enter_context(mock.patch.object(attention, "fuses_projections", lambda x: stacked))
    stack.enter_context(mock.patch.object(transformer, "causal_kernel_applies", lambda x: causal))
    return stack


def batch(pairs: int, length: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(4, vocab, (n,), generator=g).tolist()  # noqa: E731
    return make_batch([ids(length - 1) + [EOS] for _ in range(pairs)], [ids(length - 1) for _ in range(pairs)])


def training_step_launches(config: TransformerConfig, b: Batch, choices: Choices) -> int:
    """Operators in one training step (forward, backward, Adam) of a fresh model in bf16, after a first step that
    makes Adam's state."""
    torch.manual_seed(0)
    model = Transformer(config).train()
    precision = "bf16-weights" if choices.bf16_weights else "bf16"
    module, optimizer = for_training(model, make_optimizer(model, torch.device("cpu")), precision)
    with on_a_gpu(choices.stacked, choices.causal):
        step = lambda: train_step(module, loss_of(model), optimizer, [b], 1e-4, step_autocast(precision))  # noqa: E731
        step()
        return launches(step)


def decoding_step_launches(config: TransformerConfig, src: torch.Tensor, choices: Choices) -> int:
    """Operators per decoding step of beam search (beam 4) in bf16: a search of 3 steps less one of 1 (replayed: of 12
    less 2, the ten replays). Under autocast, or with bf16 weights as `translate` searches on a GPU: a copy of the
    model (`searched_model`)."""
    torch.manual_seed(0)
    model = Transformer(config).eval()
    model = working_copy(model) if choices.bf16_weights else model
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=not choices.bf16_weights)
    longer, shorter = (12, 2) if choices.replayed else (3, 1)

    def search(steps: int) -> int:
        with ExitStack() as stack:
            counted = stack.enter_context(Launches())
            if choices.replayed:
                stack.enter_context(mock.patch.object(decoding, "at_fixed_shapes", lambda model, device: True))
                stack.enter_context(mock.patch.object(decoding, "graphs_apply", lambda device: True))
                stack.enter_context(mock.patch.object(decoding, "captured", replayed_as_one(counted)))
                stack.enter_context(mock.patch.object(decoding, "DONE_CHECK_EVERY", 10**9))
            beam_search(model, src, src.eq(PAD), extra_len=steps - src.size(1))
        return counted.count

    with on_a_gpu(choices.stacked, causal=False), autocast:
        return (search(longer) - search(shorter)) // (longer - shorter)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m ablations.bench.launches", description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=1000, help="vocabulary (the count does not depend on it)")
    args = p.parse_args(argv)
    config = TransformerConfig(vocab_size=args.vocab, P_drop=0.1)  # the base model (Table 3)
    b, src = batch(8, 24, args.vocab), batch(4, 2, args.vocab).src
    lines = [
        f"`python -m ablations.bench.launches {' '.join(argv if argv is not None else sys.argv[1:])}`: operators that "
        f"do work (kernels on a GPU) in one step of the base model (N={config.N}) in bf16, the GPU's choices",
        "",
        "| reference | training step | beam-search step (beam 4) |",
        "|---|---:|---:|",
    ]
    for choices in CHOICES:
        search = "-" if choices.causal and not choices.bf16_weights else decoding_step_launches(config, src, choices)
        training = "-" if choices.replayed else training_step_launches(config, b, choices)
        lines.append(f"| {choices.name} | {training} | {search} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
