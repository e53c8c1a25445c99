"""A beam-search decoding step captured as a CUDA graph and replayed, one launch a step instead of some two hundred.

A step of beam search at batch sizes of a few hundred rows is bound by the host launching kernels, not by the GPU
(docs/benchmark.md). With a fixed-shape cache (`model.cache.KVCache.fix_shapes`) every step from the second has the
same shapes and reads and writes the same memory, so the step (the cache's reorder by the last step's survivors,
then the decoder on the newest tokens) is captured once per batch of sentences and replayed for every later step.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

Step = Callable[[Tensor, Tensor], Tensor]  # (newest tokens (rows, 1), rows to keep) -> next-token logits (rows, V)


class Replay:
    """A captured step: its inputs copied into the tensors it was captured with, the graph replayed, its logits
    returned (the same tensor each time: read it before the next replay)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple[Tensor, Tensor], logits: Tensor) -> None:
        self.graph, self.inputs, self.logits = graph, inputs, logits

    def __call__(self, tokens: Tensor, rows: Tensor) -> Tensor:
        for into, value in zip(self.inputs, (tokens, rows)):
            into.copy_(value)
        self.graph.replay()
        return self.logits


def captured(step: Step, tokens: Tensor, rows: Tensor) -> tuple[Tensor, Replay | None]:
    """Take this step for real on a side stream (which also warms up what capturing needs), then capture it; returns
    its logits and the replay of the captured step. A capture that fails leaves the step taken, with a warning, and no
    replay: the search goes on without a graph."""
    inputs = (tokens.clone(), rows.clone())
    side, main = torch.cuda.Stream(tokens.device), torch.cuda.current_stream(tokens.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        logits = step(*inputs)
    main.wait_stream(side)
    logits.record_stream(main)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            replayed = step(*inputs)
    except RuntimeError as exc:
        warnings.warn(f"beam search: capturing a decoding step as a CUDA graph failed ({exc}); going on without")
        return logits, None
    return logits, Replay(graph, inputs, replayed)
