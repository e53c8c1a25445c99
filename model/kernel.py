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
import shutil
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
STALE_LOCK_S = 300  # a build takes 30-60 s on 2 cores; a lock this old was left by a stopped build


def build_tag() -> str:
    """One build per CPU (it is tuned with -march=native, and a home folder may be shared by different machines) and per
    torch installation and version (it links against that torch: nox's sessions each have their own, and would rebuild
    in turn). The CPU is named by /proc/cpuinfo's model and feature lines (x86: "flags", ARM: "Features")."""
    try:
        cpu = [line for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")][:4]
    except OSError:
        cpu = []
    described = f"{platform.machine()} {platform.processor()} {cpu} {Path(torch.__file__).parent} {torch.__version__}"
    return hashlib.sha1(described.encode()).hexdigest()[:10]


def wait_for_other_build(lock: Path) -> None:
    """torch waits without end for a build's lock file, which a build stopped by SIGTERM or SIGKILL leaves behind: wait
    here while another process may still be building, and clear the lock once no build could have taken so long."""
    said = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
            return
        if not said:
            print(f"waiting for another process's build of the decoding kernels ({lock}, {age:.0f} s old; cleared at "
                  f"{STALE_LOCK_S} s) ...", file=sys.stderr)
            said = True
        time.sleep(1)


def failure_line(error: Exception) -> str:
    """The line of a failed build that says why: the compiler's first error, else the first line of the message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return next((line for line in lines if "error:" in line), lines[0])[:200]  # "file:line:col: error: ..." (gcc, clang)


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
        wait_for_other_build(build / "lock")
        if shutil.which("ninja") is None:  # the pinned ninja sits beside this Python, not on PATH unless its venv is active
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        built = build / f"{name}.so"
        if not built.exists() or built.stat().st_mtime < SOURCE.stat().st_mtime:
            print("building the decoding kernels (once per CPU and torch installation, ~30 s) ...", file=sys.stderr)
        flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
        return load(name=name, sources=[str(SOURCE)], extra_cflags=flags, build_directory=str(build), verbose=False)
    except Exception as error:  # no compiler, no ninja, a read-only cache: decoding still works through torch ops
        print(f"the decoding kernels could not be built ({failure_line(error)}); decoding runs through torch ops (same "
              f"results, slower). Install a C++ compiler and ninja, or set {SWITCH}=0 to skip it.", file=sys.stderr)
        return None


def applies(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> bool:
    """Whether the kernel can take this call: a few queries on the CPU, float32/64, no gradient wanted, k and v of the
    queries' own rows and heads, in the layouts decoding produces (unit stride along the head's width)."""
    return (
        q.device.type == "cpu" and q.dim() == k.dim() == v.dim() == 4 and allowed.dim() <= 4 and q.size(-2) <= MAX_QUERIES
        and k.shape[:2] == q.shape[:2] and k.size(-1) == q.size(-1) and v.shape[:3] == k.shape[:3]  # no broadcast k, v
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
