"""torch as it was before any adapter was imported, for the paper's side of a comparison.

An adapter may change torch's own functions when it is imported (torch.softmax replaced by a variant, a LayerNorm's
forward patched). The model then computes with the change, which is its right; but the oracle's reference, run in the
same process, would call the changed functions too and agree with the model by construction. So the functions of
torch, torch.nn.functional, torch.Tensor and torch.nn's modules are noted when the harness is imported, and the
reference runs with those, whatever was patched since.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

NAMESPACES: tuple[object, ...] = (
    torch,
    F,
    torch.Tensor,
    *(cls for _, cls in inspect.getmembers(nn, inspect.isclass) if issubclass(cls, nn.Module)),
)
TORCH_DIR = str(Path(torch.__file__).parent)
ORIGINAL = {(id(space), name): value for space in NAMESPACES for name, value in vars(space).items() if callable(value)}


def _harness_own(value: object) -> bool:
    """A replacement torch or the harness's tools made themselves (torch wraps manual_seed on first use, in
    torch/_compile.py; hypothesis seeds through a wrapper): not an adapter's change."""
    code = getattr(value, "__code__", None)
    return str(getattr(value, "__module__", "")).startswith(("torch", "hypothesis")) or (
        code is not None and code.co_filename.startswith(TORCH_DIR)
    )


def _where(space: object) -> str:
    return getattr(space, "__name__", type(space).__name__)


@contextmanager
def pristine() -> Iterator[list[str]]:
    """While open, every function of torch noted at import is back as it was; yields the names that had changed."""
    changed = [
        (space, name, vars(space).get(name))
        for space in NAMESPACES
        for name, value in list(vars(space).items())
        if callable(value) and ORIGINAL.get((id(space), name), value) is not value and not _harness_own(value)
    ]
    for space, name, _ in changed:
        setattr(space, name, ORIGINAL[(id(space), name)])
    try:
        yield [f"{_where(space)}.{name}" for space, name, _ in changed]
    finally:
        for space, name, current in changed:
            setattr(space, name, current)
