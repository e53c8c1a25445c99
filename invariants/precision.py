"""The precision a model computes at, found by watching its operations, so that each check judges it at that precision.

The checks run a model in float64, where two orders of the same sums agree to ~1e-15. A correct model may still
compute part of its work in float32 on purpose (a softmax with `dtype=torch.float32`, a loss built in float32):
the same sums then agree only to ~1e-7, and a float64 tolerance would fail a model that is right. So each model is
watched once, op by op (a TorchDispatchMode sees every aten operation, fused kernels included), through a forward
pass and its loss: an operation that takes a float64 tensor and gives back a lower-precision one is where the model
leaves float64, and so is one that mixes a lower-precision operand into a float64 result (a smoothed target built in
float32). The checks whose tolerance has a float32 variant are judged with it, and the report says why.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from invariants.guard import member_frame

LOWER = (torch.float32, torch.bfloat16, torch.float16)
PARTS = ("forward", "loss")  # what a property's tolerance depends on: the model's pass, or its loss


@dataclass(frozen=True)
class Downcast:
    """Where a float64 model first computes at a lower precision: the operation, the dtype and the model's own line."""

    op: str  # e.g. "aten._softmax"
    dtype: torch.dtype
    where: str  # "the model's attend (mine.py:42)", or "" when no frame of the model's own code is on the stack

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.op} gives {dtype}{' in ' + self.where if self.where else ''}"


class _Watch(TorchDispatchMode):
    """Records the first operation that turns float64 into a lower precision, or mixes a lower one into float64."""

    def __init__(self) -> None:
        super().__init__()
        self.found: Downcast | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.found is None:
            inputs = [t.dtype for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            outputs = [t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            # float64 turned into a lower precision, or a lower-precision operand (a float32 smoothed target built
            # from integers, say) mixed into a float64 computation
            lower = next((d for d in outputs if d in LOWER), None) if torch.float64 in inputs else None
            lower = lower or (next((d for d in inputs if d in LOWER), None) if torch.float64 in outputs else None)
            if lower is not None:
                self.found = Downcast(str(func.overloadpacket), lower, _model_frame())
        return out


def _model_frame() -> str:
    """The innermost frame of the model's own code on the current stack, as guard.member_frame words it."""
    frames = traceback.extract_stack()[:-2]
    return member_frame(reversed(frames))


def watch(call) -> Downcast | None:
    """Run `call()` (a float64 model's forward or loss) and return where it first computes below float64, or None."""
    mode = _Watch()
    with mode:
        call()
    return mode.found


def judged_at(downcast: Downcast | None, part: str) -> str:
    """The note a verdict carries when it is judged at float32 precision."""
    if downcast is None:
        return ""
    return f"the model's {part} computes below float64 ({downcast}): judged at float32 precision"
