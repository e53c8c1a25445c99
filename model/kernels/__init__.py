"""The reference's CPU kernels (the .cpp files beside this one), compiled on first use: attention for a decoding step's few
queries and for heads up to 8 wide, beam search's cache reorder, and the label-smoothed loss.

torch's batched matmul and softmax are slow on the CPU for such small products; each kernel computes what its torch-ops
path computes (sums in another order). Without a build, or with AIAYN_ATTENTION_KERNEL=0, the torch ops run instead:
the same results, slower. Inside `without_building()` (the invariants hold it) a build on disk is used and none is
started. How they work and what they save: docs/benchmark.md, "The CPU kernels".
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

import torch
from torch import Tensor

SOURCES = [Path(__file__).with_name(f"{name}.cpp") for name in ("attention", "narrow", "reorder", "loss")]
HEADER = Path(__file__).with_name("kernels.h")
SWITCH = "AIAYN_ATTENTION_KERNEL"  # "0": never build or use the kernels
MAX_QUERIES = 8  # per row and head: a decoding step of beam search with up to 8 beams
MAX_WIDTH = 256  # d_k, d_v: the kernel's fixed-size buffers
NARROW = 8  # d_k, d_v up to this (one register of 8 lanes) take the kernel for any number of queries
PROFILER_NAME = "aiayn::few_query_attention"
NARROW_PROFILER_NAME = "aiayn::narrow_head_attention"
LOSS_PROFILER_NAME = "aiayn::smoothed_nll"
REORDER_PROFILER_NAME = "aiayn::reorder_rows"
STALE_LOCK_S = 300  # well above a build's time (docs/benchmark.md); a lock this old was left by a stopped build


def build_tag() -> str:
    """One build per CPU (it is tuned with -march=native, and a home folder may be shared by different machines), per
    torch installation and version (it links against that torch: nox's sessions each have their own, and would rebuild
    in turn) and per checkout (two checkouts using one venv would otherwise rebuild in one folder in turn, each build
    naming its own source paths). The CPU is named by /proc/cpuinfo's model and feature lines (x86: "flags", ARM:
    "Features")."""
    try:
        cpu = [
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")
        ][:4]
    except OSError:
        cpu = []
    described = (
        f"{platform.machine()} {platform.processor()} {cpu} {Path(torch.__file__).parent} {torch.__version__} "
        f"{Path(__file__).resolve().parent}"
    )
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
            print(
                f"waiting for another process's build of the attention kernels ({lock}, {age:.0f} s old; cleared at "
                f"{STALE_LOCK_S} s) ...",
                file=sys.stderr,
            )
            said = True
        time.sleep(1)


def failure_line(error: Exception) -> str:
    """The line of a failed build that says why: the compiler's first error, else the first line of the message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return next((line for line in lines if "error:" in line), lines[0])[
        :200
    ]  # "file:line:col: error: ..." (gcc, clang)


_state: dict[str, object] = {}  # "module": the extension (None: it cannot be built); "on_disk": a build was found
_holds = [0]  # open `without_building()` blocks


def build_folder() -> Path:
    """Where this CPU and torch installation's build lives (named by `build_tag`)."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR", get_default_build_root())) / f"aiayn_attention_{build_tag()}"


def built_on_disk(build: Path) -> bool:
    """Whether the folder holds a library built from the current sources."""
    built = build / f"{build.name}.so"
    return built.exists() and built.stat().st_mtime >= max(f.stat().st_mtime for f in [*SOURCES, HEADER])


@contextmanager
def without_building() -> Iterator[None]:
    """Inside the block `compiled()` loads a build already on disk but starts none: None instead (not remembered, so
    that a later call outside the block may still build)."""
    _holds[0] += 1
    try:
        yield
    finally:
        _holds[0] -= 1


def forget() -> None:
    """Forget what `compiled()` found, so that the next call looks again (tests)."""
    _state.clear()


def compiled() -> ModuleType | None:
    """The built extension, or None (switched off, held off by `without_building()` with no build on disk, or it
    cannot be built here: said once, on stderr). Loaded, or built, once per process."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    if "module" not in _state:
        if _holds[0]:
            if "on_disk" not in _state:  # a build in progress elsewhere (its lock) is not waited for either
                build = build_folder()
                _state["on_disk"] = built_on_disk(build) and not (build / "lock").exists()
            if not _state["on_disk"]:
                return None
        _state["module"] = build_or_load()
    return _state["module"]  # type: ignore[return-value]


def use_own_ninja() -> None:
    """Build with the ninja installed beside this Python (the pinned one) whenever there is one, first on PATH even
    where the venv is not active and the machine has a ninja of its own: two ninja versions hash a build's commands
    differently, so each would rebuild all that the other built, in turn, in the one build folder."""
    own = Path(sys.executable).parent / "ninja"
    found = shutil.which("ninja")
    if own.is_file() and (found is None or Path(found).resolve() != own.resolve()):
        os.environ["PATH"] = os.pathsep.join([str(own.parent), os.environ.get("PATH", "")])


def build_or_load() -> ModuleType | None:
    """Load the extension, building it first when the sources are newer than the build; None where that fails."""
    from torch.utils.cpp_extension import load

    build = build_folder()
    name = build.name
    try:
        build.mkdir(parents=True, exist_ok=True)
        wait_for_other_build(build / "lock")
        use_own_ninja()
        if not built_on_disk(build):
            print(
                "building the attention kernels (once per CPU and torch installation, about half a minute) ...",
                file=sys.stderr,
            )
        flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
        return load(
            name=name, sources=[str(f) for f in SOURCES], extra_cflags=flags, build_directory=str(build), verbose=False
        )
    except Exception as error:  # no compiler, no ninja, a read-only cache: decoding still works through torch ops
        print(
            f"the attention kernels could not be built ({failure_line(error)}); attention runs through torch ops (same "
            f"results, slower). Install a C++ compiler and ninja, or set {SWITCH}=0 to skip it.",
            file=sys.stderr,
        )
        return None


def wants_gradient(*tensors: Tensor) -> bool:
    """Whether autograd will record an op on these tensors."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


def applies(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> bool:
    """Whether the kernels can take this call: on the CPU, float32/64, k and v of the queries' own rows and heads, with
    unit stride along the head's width (the layouts the model produces); and either a few queries with no gradient
    wanted (a decoding step) or narrow heads (d_k, d_v <= NARROW)."""
    return (
        q.device.type == "cpu"
        and q.dim() == k.dim() == v.dim() == 4
        and allowed.dim() <= 4
        and k.shape[:2] == q.shape[:2]
        and k.size(-1) == q.size(-1)
        and v.shape[:3] == k.shape[:3]  # no broadcast k, v
        and q.dtype in (torch.float32, torch.float64)
        and k.dtype == v.dtype == q.dtype
        and allowed.dtype == torch.bool
        and q.size(-1) <= MAX_WIDTH
        and v.size(-1) <= MAX_WIDTH
        and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        and ((q.size(-2) <= MAX_QUERIES and not wants_gradient(q, k, v)) or max(q.size(-1), v.size(-1)) <= NARROW)
        and compiled() is not None
    )


def attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V over the allowed keys, (B, h, T_q, d_v); zero for a query with no allowed key;
    differentiable in q, k and v. Where `applies` says so.

    The result is a view of a (B, T_q, h, d_v) tensor, so that joining the heads for W^O copies nothing."""
    allowed = allowed.expand(*q.shape[:3], k.size(-2))  # (B, h, T_q, T_k), as the kernels read it (a view)
    if q.size(-2) <= MAX_QUERIES and not wants_gradient(q, k, v):
        with torch.profiler.record_function(PROFILER_NAME):  # named in torch.profiler's tables like an aten op
            return compiled().few_query_attention(q, k, v, allowed).transpose(1, 2)
    return _NarrowHeadAttention.apply(q, k, v, allowed).transpose(1, 2)


class _NarrowHeadAttention(torch.autograd.Function):
    """Every query of a row and head at once, forward and backward: the forward keeps the probabilities, and the
    backward takes the gradients from them (softmax's Jacobian)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
        with torch.profiler.record_function(NARROW_PROFILER_NAME):
            out, probs = compiled().narrow_attention(q, k, v, allowed)
        ctx.save_for_backward(q, k, v, probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, probs = ctx.saved_tensors
        with torch.profiler.record_function(NARROW_PROFILER_NAME):
            dq, dk, dv = compiled().narrow_attention_backward(grad.contiguous(), q, k, v, probs)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), None


def reorder_rows(buffers: list[Tensor], index: Tensor, filled: int) -> bool:
    """Row r of every buffer (rows, h, capacity, d) takes the first `filled` positions of row index[r], in place, each
    moved row copied once; False (nothing done) where the kernel cannot take them, and the caller uses torch ops."""
    if not (
        index.device.type == "cpu"
        and all(b.device.type == "cpu" and b.is_contiguous() for b in buffers)
        and compiled() is not None
    ):
        return False
    with torch.profiler.record_function(REORDER_PROFILER_NAME):
        compiled().reorder_rows(buffers, index.long().contiguous(), filled)
    return True


def takes_loss(logits: Tensor) -> bool:
    """Whether `smoothed_nll` can take these logits: on the CPU, float32/64."""
    return logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and compiled() is not None


def smoothed_nll(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of logits (N, V): (1 - eps) * -log p(target) + eps * mean over the vocabulary of -log p; and the row's
    maximum m and log sum exp(logits - m), for `smoothed_nll_backward`."""
    with torch.profiler.record_function(LOSS_PROFILER_NAME):
        return tuple(compiled().smoothed_nll(logits.contiguous(), target.contiguous(), eps))


def smoothed_nll_backward(
    logits: Tensor, target: Tensor, top: Tensor, log_sum: Tensor, scale: Tensor, eps: float
) -> Tensor:
    """The gradient of sum_n scale[n] * smoothed_nll(logits)[n] with respect to the logits."""
    with torch.profiler.record_function(LOSS_PROFILER_NAME):
        return compiled().smoothed_nll_backward(
            logits.contiguous(), target.contiguous(), top, log_sum, scale.contiguous(), eps
        )
