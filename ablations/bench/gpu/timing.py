"""The GPU benchmark's training measurements (python -m ablations.bench.gpu runs them): training steps of several
systems on the same batches, eager and compiled, under chosen attention backends.

Eager entries come first: each one's warm-up, then their timed steps, interleaved repetition by repetition. Compiled
entries come after, one at a time, so that a compile (and inductor's worker processes) never runs beside a timed eager
step: each compiles once (dynamic shapes from the first step) in its warm-up, then takes its timed steps; it starts
only when the time left holds a compile. A timed step in which torch compiled a graph is kept apart, so that step
times are steps, not compiling. Timed steps are clocked as the runner clocks its steps (ablations/training/clock.py):
CUDA events at each step's start and end, read once the timed steps are done, with no wait for the GPU between steps,
so that the bench's step times and the runner's are the same measure; warm-up steps are timed on the host after
torch.cuda.synchronize(). A step that raises under a restricted attention backend marks that entry unsupported, and the
others go on. All of it runs under the time limit's alarm, which ends the work where it is (a compile, a step) and
keeps what was measured.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from tqdm.auto import tqdm

from ablations.bench import peers
from ablations.bench.variants import VARIANTS
from ablations.bench.workload import alternate
from ablations.training.backends import sdpa_backend
from ablations.training.clock import StepClock, percentiles
from ablations.training.compiling import compile_model, compiles
from ablations.training.train import loss_of, make_optimizer, train_step
from model import TransformerConfig, count_parameters
from model.batch import Batch
from model.params import training_flops

# The systems by their short names (--systems) and the names of their builds in ablations/bench/variants.py.
SYSTEMS = {"reference": "reference", "torch-nn": "torch.nn.Transformer adapter", "hf-marian": "HF MarianMT, same dims"}
MODES = ("eager", "compiled")
PENDING = "not measured yet"
WARMED = "warmed up, not timed yet"
MEASURED = "measured"
TIME_UP = "not measured: the time limit came first"


def no_report(stage: str) -> None:
    """What the measuring calls after each stage when no report is being written (tests)."""


class TimeUp(Exception):
    """The time limit rang: the work under way (a compile, a step) is abandoned, and what was measured is reported."""


@dataclass(frozen=True)
class Deadline:
    """An optional limit in seconds from `start` (when the data is ready: reading it is timed apart)."""

    limit_s: float | None
    start: float = field(default_factory=lambda: time.perf_counter())  # looked up when made (a fake clock in tests)

    def past(self) -> bool:
        return self.left() < 0

    def left(self) -> float:
        """Seconds before the limit (infinite without one)."""
        return float("inf") if self.limit_s is None else self.start + self.limit_s - time.perf_counter()

    @contextmanager
    def enforced(self) -> Iterator[None]:
        """Raise TimeUp wherever the work is when the limit comes (a compile can take minutes); off the main thread,
        or without a limit, nothing is raised."""
        if self.limit_s is None or threading.current_thread() is not threading.main_thread():
            yield
            return

        def ring(signum: int, frame: object) -> None:
            raise TimeUp(f"the time limit of {self.limit_s:.0f} s is spent")

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    @contextmanager
    def until_limit(self) -> Iterator[None]:
        """The block under the alarm at the limit, ended quietly where it is when the alarm rings: what it measured
        before stands."""
        try:
            with self.enforced():
                yield
        except Exception as exc:  # noqa: BLE001 - torch.compile wraps the alarm in errors of its own
            if not self.rang(exc):
                raise

    def rang(self, exc: BaseException) -> bool:
        """Whether exc is the alarm's: TimeUp in its chain of causes, or any error once the limit is past (torch can
        turn the alarm into an error of its own with no chain, such as a TypeError from its fake tensors)."""
        return caused_by(exc, TimeUp) or self.past()


@dataclass
class Entry:
    """One system trained one way (eager or compiled, under one attention backend), and what its steps measured."""

    system: str
    mode: str
    backend: str
    cfg: TransformerConfig
    counts: dict[str, int]
    step: Callable[[Batch], object]
    precision: str = "fp32"  # or 'bf16 autocast', or 'bf16 weights' (a bf16 copy, fp32 master weights: the runner's)
    status: str = PENDING  # then WARMED, MEASURED, or why it has no timing: unsupported, failed, out of memory, time
    warmup_s: float = 0.0  # untimed first steps, torch.compile's compiling included
    warmup_compiles: int = 0  # graphs compiled in them
    warmup_compiling_steps: int = 0  # those of them in which torch compiled: 1 when one compile serves every shape
    times: list[float] = field(default_factory=list)  # timed steps in which nothing compiled
    compiling: list[float] = field(default_factory=list)  # timed steps in which torch compiled a graph
    flops: float = 0.0  # model FLOPs of the steps in `times`
    tgt_tokens: int = 0  # real (non-pad) target tokens of the steps in `times`
    peak_bytes: int = 0  # the GPU memory its steps held at most


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()[:300]


def failure(exc: Exception, backend: str) -> str:
    """Why an entry has no timing: a restricted backend that raises is unsupported there, not an error."""
    text = one_line(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text:
        return f"out of memory: {text}"
    return f"{'failed' if backend == 'default' else 'unsupported'}: {text}"


def synced(device: torch.device) -> float:
    """The host clock once the device has finished the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def training_step(
    model: torch.nn.Module,
    forward: Callable,
    optimizer: torch.optim.Optimizer,
    backend: str,
    lr: float,
    autocast: torch.dtype | None,
) -> Callable[[Batch], object]:
    """One optimizer step on a batch (fused Adam, a fixed small learning rate) with attention held to `backend`."""

    def step(batch: Batch) -> object:
        with sdpa_backend(backend):
            return train_step(forward, loss_of(model), optimizer, [batch], lr, autocast)

    return step


def build_entries(
    cfg: TransformerConfig,
    systems: tuple[str, ...],
    modes: tuple[str, ...],
    backend: str,
    backends: tuple[str, ...],
    device: torch.device,
    autocast: torch.dtype | None,
    compile_backend: str = "inductor",
    lr: float = 1e-4,
) -> tuple[list[Entry], dict[str, torch.nn.Module], list[str]]:
    """Per system one model and fused Adam, trained in each mode under `backend` and eager under each of `backends`;
    returns the entries, the models by system, and a line for each system that could not be built."""
    entries, models, notes = [], {}, []
    builds = {v.name: v.build for v in VARIANTS}
    for system in systems:
        torch.manual_seed(0)
        try:
            model = builds[SYSTEMS[system]](cfg)
            if model is None:
                notes.append(f"{system}: {peers.MISSING}")
                continue
            model = model.to(device).train()
            optimizer, counts = make_optimizer(model, device), count_parameters(model.parameter_groups())
        except Exception as exc:  # noqa: BLE001 - a peer's library may refuse this config, the GPU its size
            notes.append(f"{system}: could not be built ({one_line(exc)})")
            continue
        models[system] = model
        ways = [(mode, backend) for mode in modes] + [("eager", b) for b in backends if b != backend]
        for mode, b in ways:
            forward = compile_model(model, dynamic=True, backend=compile_backend) if mode == "compiled" else model
            step = training_step(model, forward, optimizer, b, lr, autocast)
            entries.append(Entry(system, mode, b, cfg, counts, step, "bf16 autocast" if autocast else "fp32"))
    return entries, models, notes


def timed_step(entry: Entry, batch: Batch, device: torch.device) -> tuple[float, int]:
    """One warm-up step of the entry, between two waits for the device: its seconds and the graphs compiled."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    graphs, start = compiles(), synced(device)
    entry.step(batch)
    seconds = synced(device) - start
    if device.type == "cuda":
        entry.peak_bytes = max(entry.peak_bytes, torch.cuda.max_memory_allocated(device))
    return seconds, compiles() - graphs


@dataclass
class Clocked:
    """An entry's timed steps as the runner times its own: its StepClock (CUDA events on a GPU), and each marked
    step's (graphs compiled, source tokens, target tokens), in the order marked, until they are read."""

    clock: StepClock
    steps: list[tuple[int, int, int]] = field(default_factory=list)


def clocked_step(entry: Entry, batch: Batch, device: torch.device, clocked: Clocked) -> None:
    """One timed step of the entry, marked on its clock and not waited for (the device's peak memory is the
    allocator's count, kept on the host)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    graphs = compiles()
    clocked.clock.start()
    entry.step(batch)
    graphs = compiles() - graphs
    clocked.steps.append((graphs, batch.src_tokens, batch.tgt_tokens))  # before the lap: an alarm between the two
    clocked.clock.lap(graphs, batch.tgt_tokens)  # leaves a last step unlapped, which `read_clock` drops
    if device.type == "cuda":
        entry.peak_bytes = max(entry.peak_bytes, torch.cuda.max_memory_allocated(device))


def read_clock(entry: Entry, clocked: Clocked) -> None:
    """The steps marked on the entry's clock added to its times (on a GPU this waits for the last of them): plain
    steps with their FLOPs and target tokens, steps that compiled apart."""
    laps = clocked.clock.read()
    plain = [(src, tgt) for graphs, src, tgt in clocked.steps if not graphs]
    for seconds, (src, tgt) in zip(laps.steps, plain):  # in the order marked; a last step never lapped is dropped
        entry.times.append(seconds)
        entry.flops += training_flops(entry.cfg, entry.counts, src, tgt)
        entry.tgt_tokens += tgt
    entry.compiling += laps.compiling
    clocked.steps.clear()


def caused_by(exc: BaseException | None, kind: type[BaseException]) -> bool:
    """Whether an exception of `kind` is exc or in the chain of its causes (torch.compile wraps what interrupts it)."""
    for _ in range(20):  # the chain of causes, not followed without end
        if exc is None or isinstance(exc, kind):
            return exc is not None
        exc = exc.__cause__ or exc.__context__
    return False


def _fail(entry: Entry, exc: Exception, device: torch.device, deadline: Deadline, when: str) -> None:
    entry.status = TIME_UP if deadline.rang(exc) else failure(exc, entry.backend) + when
    if device.type == "cuda":
        torch.cuda.empty_cache()


def warm(entry: Entry, batches: list[Batch], device: torch.device, deadline: Deadline) -> None:
    """The entry's untimed first steps (a compiled entry's compile) under the alarm: WARMED, else why not."""
    if deadline.past():
        entry.status = TIME_UP
        return
    try:
        with deadline.enforced():
            for batch in batches:
                seconds, graphs = timed_step(entry, batch, device)
                entry.warmup_s, entry.warmup_compiles = entry.warmup_s + seconds, entry.warmup_compiles + graphs
                entry.warmup_compiling_steps += graphs > 0
        entry.status = WARMED
    except Exception as exc:  # noqa: BLE001 - unsupported backend, out of memory, time up: that entry only
        _fail(entry, exc, device, deadline, " (in warm-up)")


def warm_up(
    entries: list[Entry],
    batches: list[Batch],
    device: torch.device,
    deadline: Deadline,
    backend: str | None = None,
    report: Callable[[str], None] = no_report,
) -> None:
    """Each entry's untimed first steps, entry after entry, those under `backend` first; `report` after each."""
    for entry in tqdm(sorted(entries, key=lambda e: e.backend != backend), desc="warm-up", unit="entry", leave=False):
        warm(entry, batches, device, deadline)
        report(f"warm-up of {entry.system}, {entry.mode}, {entry.backend}")


def time_steps(entries: list[Entry], batches: list[Batch], device: torch.device, deadline: Deadline) -> int:
    """Timed steps of every warmed-up entry, all on the same batch in each repetition, the order alternating, under
    the alarm (the steps timed before it rings stand); returns the repetitions done. Each entry's clock is read once
    its steps are done, as the runner reads its clock at logging steps. An entry that raises now loses its timing (it
    would cover other batches)."""
    timing = [e for e in entries if e.status == WARMED]
    clocks = {id(e): Clocked(StepClock(device)) for e in timing}
    for entry in timing:
        entry.status = MEASURED
    done = 0
    with deadline.until_limit():
        for i, batch in enumerate(tqdm(batches, desc="timed steps", unit="rep", leave=False)):
            for entry in alternate([e for e in timing if e.status == MEASURED], i):
                try:
                    clocked_step(entry, batch, device, clocks[id(entry)])
                except Exception as exc:  # noqa: BLE001
                    if deadline.rang(exc):
                        raise
                    _fail(entry, exc, device, deadline, f" (at timed step {i + 1})")
            done = i + 1
    for entry in timing:
        if entry.status != MEASURED:
            continue
        try:
            read_clock(entry, clocks[id(entry)])
        except Exception as exc:  # noqa: BLE001 - an error of its queued steps, surfacing when waited for
            _fail(entry, exc, device, Deadline(None), " (in its timed steps)")
    return done


def shut_compile_workers() -> None:
    """Stop inductor's compile workers if any were started: a compile that the alarm abandoned leaves them compiling,
    taking the host's cores from whatever runs next. The processes that compile GPU kernels are shut down; the threads
    that compile CPU kernels (each running the C++ compiler) finish the kernel in hand and take no other."""
    inductor = sys.modules.get("torch._inductor.async_compile")
    if inductor is None:
        return
    inductor.shutdown_compile_workers()
    if inductor.AsyncCompile.pool.cache_info().currsize:
        inductor.AsyncCompile.pool().shutdown(wait=True, cancel_futures=True)
        inductor.AsyncCompile.pool.cache_clear()


def measure_compiled(
    entries: list[Entry],
    batches: list[Batch],
    warmup: int,
    device: torch.device,
    deadline: Deadline,
    estimate_s: float,
    eager_s: dict[str, float],
    report: Callable[[str], None] = no_report,
) -> None:
    """Each compiled entry in turn: its `warmup` steps (its one compile), then its timed steps on the rest of
    `batches`. One starts only when the time left holds a compile (`estimate_s` until one is measured, then the
    longest measured) and the seconds its eager twin's steps took (`eager_s` by system): else it is skipped, said so,
    rather than abandoned midway. (compile_model keeps source and target lengths apart symbols.)"""
    measured: list[float] = []
    for entry in entries:
        left, need = deadline.left(), (max(measured) if measured else estimate_s) + eager_s.get(entry.system, 0.0)
        if left < need:
            entry.status = f"not measured: no room for its compile ({max(left, 0):.0f} s left, {need:.0f} s needed)"
            report(f"{entry.system} compiled skipped")
            continue
        warm(entry, batches[:warmup], device, deadline)
        report(f"compile of {entry.system}")
        if entry.status == TIME_UP:
            shut_compile_workers()
        elif entry.status == WARMED:
            measured.append(entry.warmup_s)
            time_steps([entry], batches[warmup:], device, deadline)
            report(f"timed steps of {entry.system} compiled")


def training_rows(size: str, entries: list[Entry], peak: float | None) -> list[dict]:
    """The report's rows: rates, step-time percentiles and MFU (against `peak` FLOP/s, None: not reported)."""
    rows = []
    for e in entries:
        seconds = sum(e.times)
        ok = e.status == MEASURED and seconds > 0
        rows.append(
            {
                "size": size,
                "system": e.system,
                "mode": e.mode,
                "backend": e.backend,
                "precision": e.precision,
                "status": e.status if e.status != MEASURED or ok else "not measured: no timed step",
                "timed_steps": len(e.times),
                "tgt_tokens_per_s": e.tgt_tokens / seconds if ok else None,
                "mfu": e.flops / seconds / peak if ok and peak else None,
                **{f"step_s_{k}": v if ok else None for k, v in percentiles(e.times).items()},
                "warmup_s": e.warmup_s,
                "warmup_compiles": e.warmup_compiles,
                "warmup_compiling_steps": e.warmup_compiling_steps,
                "timed_compiling_steps": len(e.compiling),
                "timed_compiling_s": sum(e.compiling),
                "peak_gib": e.peak_bytes / 2**30 if e.peak_bytes else None,
            }
        )
    return rows
