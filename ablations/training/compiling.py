"""torch.compile for training, and how many graphs it compiled: a recompile stalls a step for tens of seconds.

With `dynamic=None` torch compiles the first shape it meets statically and, at the first change of a size, once more
with that size symbolic; batches padded to a multiple of 8 (ablations/data/batching.py) keep the sizes it meets few.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch
from torch._dynamo.utils import counters

F = TypeVar("F", bound=Callable)


def compiles() -> int:
    """Graphs compiled so far in this process (torch._dynamo's count of unique graphs; recompiles included)."""
    return int(counters["stats"]["unique_graphs"])


def compile_model(fn: F, dynamic: bool | None = None, backend: str = "inductor") -> F:
    """`fn` compiled by torch.compile (inductor on a GPU; tests pass backend='eager' to count graphs cheaply)."""
    return torch.compile(fn, dynamic=dynamic, backend=backend)
