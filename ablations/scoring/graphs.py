"""A beam-search decoding step captured as a CUDA graph and replayed, one launch a step instead of some two hundred.

A step of beam search at batch sizes of a few hundred rows is bound by the host launching kernels, not by the GPU
(docs/benchmark.md). With a fixed-shape cache (`model.cache.KVCache.fix_shapes`) and the search's state updated in
place with its step number on the device (`ablations.scoring.decoding.Beams`), every step from the second has the same
shapes and reads and writes the same memory, so the whole step (the cache's reorder, the decoder on the newest tokens,
the hypotheses finished and kept) is captured once per batch of sentences and replayed for every later step.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch


class Replay:
    """A captured step: replaying it takes the next step (every input it reads is on the device, in place)."""

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def __call__(self) -> None:
        self.graph.replay()


def captured(step: Callable[[], None], device: torch.device) -> Replay | None:
    """Take this step for real on a side stream of `device` (which also warms up what capturing needs), then capture
    it; returns the replay of the captured step, which takes the steps after it. A capture that fails leaves the step
    taken, with a warning, and no replay: the search goes on without a graph."""
    side, main = torch.cuda.Stream(device), torch.cuda.current_stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        step()
    main.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            step()
    except RuntimeError as exc:
        warnings.warn(f"beam search: capturing a decoding step as a CUDA graph failed ({exc}); going on without")
        return None
    return Replay(graph)
