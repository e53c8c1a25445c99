"""The reference's two CPU kernels for decoding (model/attention_kernel.cpp), built on first use.

A decoding step asks attention for one query per decoder row (in beam search one per beam) over every cached key.
torch's batched matmul does those tiny products slowly on the CPU, so `model.attention.attend` hands them to
`few_query_attention`, which computes the same function as its explicit path (float rounding aside: its sums run in
another order). Beam search then moves cached rows between hypotheses: `reorder_rows` copies each moved row once.
Both are compiled with torch's C++ extension tools (a C++ compiler and ninja; about 30 s) on first use, and cached under
$TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions, one build per CPU and torch installation. Without them, or with
AIAYN_ATTENTION_KERNEL=0, decoding runs through torch ops as before: the same results, slower.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("attention_kernel.cpp")
SWITCH = "AIAYN_ATTENTION_KERNEL"  # "0": never build or use the kernel
MAX_QUERIES = 8  # per row and head: a decoding step of beam search with up to 8 beams (measured faster up to 16)
MAX_WIDTH = 256  # d_k, d_v: the kernel's fixed-size buffers
PROFILER_NAME = "aiayn::few_query_attention"
REORDER_PROFILER_NAME = "aiayn::reorder_rows"
STALE_LOCK_S = 600  # a build takes about 30 s; a lock this old was left by a killed build


def build_tag() -> str:
    """One build per CPU (it is tuned with -march=native, and a home folder may be shared by different machines) and per
    torch installation (it links against that torch: nox's sessions each have their own, and would rebuild in turn)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha1(f"{platform.machine()} {flags} {Path(torch.__file__).parent}".encode()).hexdigest()[:10]


@functools.cache
def compiled() -> ModuleType | None:
    """The built extension, or None (switched off, or it cannot be built here: said once, on stderr)."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    from torch.utils.cpp_extension import get_default_build_root, load

    name = f"aiayn_attention_{build_tag()}"
    build = Path(os.environ.get("TORCH_EXTENSIONS_DIR", get_default_build_root())) / name
    try:
        build.mkdir(parents=True, exist_ok=True)
        lock = build / "lock"  # torch waits for this file without end: a build killed by SIGKILL leaves it behind
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        built = build / f"{name}.so"
        if not built.exists() or built.stat().st_mtime < SOURCE.stat().st_mtime:
            print("building the decoding kernels (once per CPU and torch installation, ~30 s) ...", file=sys.stderr)
        flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
        return load(name=name, sources=[str(SOURCE)], extra_cflags=flags, build_directory=str(build), verbose=False)
    except Exception as error:  # no compiler, no ninja, a read-only cache: decoding still works through torch ops
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"the decoding kernels could not be built ({reason}); decoding runs through torch ops (same "
              f"results, slower). Install a C++ compiler and ninja, or set {SWITCH}=0 to skip it.", file=sys.stderr)
        return None


def applies(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> bool:
    """Whether the kernel can take this call: a few queries on the CPU, float32/64, no gradient wanted, in the
    layouts decoding produces (unit stride along the head's width)."""
    return (
        q.device.type == "cpu" and q.dim() == 4 and q.size(-2) <= MAX_QUERIES
        and q.dtype in (torch.float32, torch.float64) and k.dtype == v.dtype == q.dtype and allowed.dtype == torch.bool
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and q.size(-1) <= MAX_WIDTH and v.size(-1) <= MAX_WIDTH and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        and compiled() is not None
    )


def few_query_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V over the allowed keys, (B, h, T_q, d_v); zero for a query with no allowed key.

    The result is a view of a (B, T_q, h, d_v) tensor, so that joining the heads for W^O copies nothing."""
    B, h, T_q, _ = q.shape
    with torch.profiler.record_function(PROFILER_NAME):  # named in torch.profiler's tables like an aten op
        return compiled().few_query_attention(q, k, v, allowed.expand(B, h, T_q, k.size(-2))).transpose(1, 2)


def reorder_rows(buffers: list[Tensor], index: Tensor, filled: int) -> bool:
    """Row r of every buffer (rows, h, capacity, d) takes the first `filled` positions of row index[r], in place, each
    moved row copied once; False (nothing done) where the kernel cannot take them, and the caller uses torch ops."""
    if not (index.device.type == "cpu" and all(b.device.type == "cpu" and b.is_contiguous() for b in buffers)
            and compiled() is not None):
        return False
    with torch.profiler.record_function(REORDER_PROFILER_NAME):
        compiled().reorder_rows(buffers, index.long().contiguous(), filled)
    return True
