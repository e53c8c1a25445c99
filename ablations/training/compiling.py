"""torch.compile for training, and how many graphs it compiled: a recompile stalls a step for tens of seconds.

The model is compiled with every size symbolic from the first step (`dynamic=True`), so the batches' many shapes
(rows, and lengths padded to a multiple of 8 by ablations/data/batching.py) share one graph: one compile per run.
With torch's default (`dynamic=None`) the first shape is compiled static and the first change of a size compiles a
second graph. Two cases still compile again: a size of 0 or 1 (torch specialises those; a batch of one row), and
code that branches on a size (a guard that a new size fails). Inductor's own fusion choices can branch on a size too:
its mix-order reduction fuses two reductions only above a size, a guard that a later batch fails (a second compile
mid-run; docs/benchmark.md, the first GPU run), so that fusion is off. Under DDP the graph is split at its gradient buckets.
Sizes stay apart symbols (no duck sizing): with torch's default, a first batch whose padded source and target lengths
are equal gives both one symbol, and the first batch where they differ compiles again.
The model's loss (model/objective.py's chunked pre-softmax loss) loops over a number of chunks that follows the
batch's size, so the graph breaks before it; what it does to each chunk's logits (softmax, loss, gradient) is compiled
as a second graph, in a few passes over the logits instead of eager torch's dozen.
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

import torch

from model.objective import Scorer, chunk_scores_by_torch_ops, chunks_scored_by

F = TypeVar("F", bound=Callable)


def compiles() -> int:
    """Graphs compiled so far in this process (torch._dynamo's count of unique graphs; recompiles included). Dynamo is
    imported on the first compile, not here: its import takes seconds that an uncompiled run does not need."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_model(fn: F, dynamic: bool | None = True, backend: str = "inductor") -> F:
    """`fn` compiled by torch.compile (inductor on a GPU; tests pass backend='eager' to count graphs cheaply), with
    the chunks of its loss scored by a compiled `chunk_scores_by_torch_ops` (one per backend, shared by every model)."""
    from torch.fx.experimental import _config as fx_config

    compiled = torch.compile(fn, dynamic=dynamic, backend=backend, options=_options(backend))
    scorer = compiled_scorer(backend)

    def call(*args, **kwargs):
        # The patch is read when a call traces: equal sizes keep their own symbols.
        with fx_config.patch(use_duck_shape=False), chunks_scored_by(scorer):
            return compiled(*args, **kwargs)

    return call  # type: ignore[return-value]


_SCORERS: dict[str, Scorer] = {}


def compiled_scorer(backend: str) -> Scorer:
    """The loss's chunk scoring compiled with every size symbolic: a chunk's rows vary from batch to batch."""
    if backend not in _SCORERS:
        _SCORERS[backend] = torch.compile(
            chunk_scores_by_torch_ops, dynamic=True, backend=backend, options=_options(backend)
        )
    return _SCORERS[backend]


def _options(backend: str) -> dict | None:
    from torch._inductor import config as inductor_config

    if backend == "inductor" and hasattr(inductor_config.triton, "mix_order_reduction"):
        return {"triton.mix_order_reduction": False}  # a size guard in its fusion decision: a recompile
    return None
