"""How fast training runs against what this CPU or GPU can do: thread choice, a GEMM calibration, and the
tokens/s and fraction-of-GEMM-rate figures that the benchmark and the grid report."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

from model.config import TransformerConfig
from model.params import training_flops

SMALL_D_MODEL = 128  # up to this width one thread by default: a second gains a little idle, loses many-fold under load


def cpu_times() -> tuple[int, int]:
    """The machine's CPU time so far, (all, idle), in clock ticks (the first line of /proc/stat; OSError elsewhere)."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks), ticks[3] + ticks[4]


def busy_cores(interval: float = 0.25) -> float:
    """Cores busy over the last `interval` seconds (this process sleeps meanwhile); the 1-minute load average where
    /proc/stat is missing. The load average lags: just after a package install it still counts the install."""
    try:
        all_0, idle_0 = cpu_times()
        time.sleep(interval)
        all_1, idle_1 = cpu_times()
    except (OSError, ValueError):
        all_1 = all_0 = 0
    if all_1 <= all_0:  # no /proc/stat, or no tick passed
        return os.getloadavg()[0]
    return (1 - (idle_1 - idle_0) / (all_1 - all_0)) * (os.cpu_count() or 1)


def free_cores() -> int:
    """CPU cores not busy with other processes: this process's cores minus the busy ones, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, round(cores - busy_cores())))


def choose_threads(cfg: TransformerConfig, requested: int | None = None) -> int:
    """Intra-op CPU threads for training or decoding cfg: `requested`, else OMP_NUM_THREADS if set, else one thread
    for models up to d_model 128 and the free cores for larger ones. A thread that waits for a busy core stalls every
    op, so on a loaded machine more threads than free cores make small models many times slower; and processes
    started together would each see every core free. On an idle machine two threads train the cpu budget's model
    faster (docs/benchmark.md has the measurements): pass `requested` (--threads) there."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads={requested} must be at least 1")
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    return 1 if cfg.d_model <= SMALL_D_MODEL else free_cores()


def median_seconds(
    work: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter, warmup: int = 0
) -> float:
    """Median time of `repeats` calls of work after `warmup` untimed ones, by `clock`: wall time, or this process's
    CPU time (time.process_time), which other processes on a busy machine do not enter."""
    for _ in range(warmup):
        work()
    times = []
    for _ in range(repeats):
        start = clock()
        work()
        times.append(clock() - start)
    return statistics.median(times)


def gemm_flops(
    device: torch.device,
    n: int = 1024,
    k: int = 512,
    m: int = 2048,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Measured fp32 matrix-multiply rate (FLOP/s, over the median of `repeats`) at the base model's FFN shape, on the
    current thread count: the yardstick for what fraction of this machine a training step uses. `clock` is the
    timer the steps compared with it are taken with (wall, or CPU time on a busy machine)."""
    a, b = torch.randn(n, k, device=device), torch.randn(k, m, device=device)

    def multiply() -> None:
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()

    return (
        2 * n * k * m / median_seconds(multiply, repeats, clock, warmup=1)
    )  # the first call warms the allocator and the BLAS


def throughput(
    cfg: TransformerConfig,
    counts: dict[str, int],
    src_tokens: int,
    tgt_tokens: int,
    seconds: float,
    gemm_rate: float | None,
) -> dict[str, float | None]:
    """Training throughput of a run or a step: tokens/s and the model FLOP rate as a fraction of the measured
    GEMM rate (`gemm_flops`); counts is model.params.count_parameters' result."""
    flops = training_flops(cfg, counts, src_tokens, tgt_tokens)
    return {
        "tokens_per_s": (src_tokens + tgt_tokens) / seconds,
        "tgt_tokens_per_s": tgt_tokens / seconds,
        "gemm_fraction": flops / seconds / gemm_rate if gemm_rate else None,
    }
