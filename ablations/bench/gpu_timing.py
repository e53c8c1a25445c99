"""The GPU benchmark's measurements (python -m ablations.bench.gpu runs them): training steps of several systems on
the same batches, eager and compiled, under chosen attention backends, interleaved repetition by repetition; and
beam search beside HF generate.

Each entry's first steps are warm-up, timed apart (they hold torch.compile's compiling); a timed step in which torch
compiled a graph is kept apart too, so that step times are steps, not compiling. On CUDA every timed region starts
and ends with torch.cuda.synchronize(). A step that raises under a restricted attention backend marks that entry
unsupported, and the others go on.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from tqdm.auto import tqdm

from ablations.bench import peers
from ablations.bench.measure import alternate
from ablations.bench.variants import VARIANTS
from ablations.data.bpe import PAD
from ablations.scoring.decoding import beam_search
from ablations.training.backends import sdpa_backend
from ablations.training.clock import percentiles
from ablations.training.compiling import compile_model, compiles
from ablations.training.train import make_optimizer, train_step
from model import Transformer, TransformerConfig, count_parameters
from model.batch import Batch
from model.params import training_flops

# The systems by their short names (--systems) and the names of their builds in ablations/bench/variants.py.
SYSTEMS = {"reference": "reference", "torch-nn": "torch.nn.Transformer adapter", "hf-marian": "HF MarianMT, same dims"}
MODES = ("eager", "compiled")
# Shares of --time-limit: no entry starts its warm-up after the first, a warm-up still running (compiling) at the
# second is abandoned, no timed repetition starts after the third, no beam search after the limit itself.
WARMUP_STARTS, WARMUP_ENDS, TIMING_ENDS = 0.5, 0.75, 0.85
MEASURED = "measured"
TIME_UP = "not measured: the time limit came first"


class TimeUp(Exception):
    """The time limit rang: the work under way (a compile, a step) is abandoned, and what was measured is reported."""


@dataclass(frozen=True)
class Deadline:
    """An optional limit in seconds from `start`; `past(f)`: more than the fraction f of it is spent."""

    limit_s: float | None
    start: float = field(default_factory=time.perf_counter)

    def past(self, fraction: float = 1.0) -> bool:
        return self.limit_s is not None and time.perf_counter() - self.start > fraction * self.limit_s

    @contextmanager
    def enforced(self, fraction: float) -> Iterator[None]:
        """Raise TimeUp wherever the work is when that fraction of the limit is spent (a compile can take minutes);
        off the main thread, or without a limit, nothing is raised."""
        if self.limit_s is None or threading.current_thread() is not threading.main_thread():
            yield
            return

        def ring(signum: int, frame: object) -> None:
            raise TimeUp(f"{fraction:.0%} of the time limit of {self.limit_s:.0f} s is spent")

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.start + fraction * self.limit_s - time.perf_counter(), 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@dataclass
class Entry:
    """One system trained one way (eager or compiled, under one attention backend), and what its steps measured."""

    system: str
    mode: str
    backend: str
    cfg: TransformerConfig
    counts: dict[str, int]
    step: Callable[[Batch], object]
    status: str = MEASURED  # else why it has no timing: unsupported, failed, out of memory, time limit
    warmup_s: float = 0.0  # untimed first steps, torch.compile's compiling included
    warmup_compiles: int = 0
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
            return train_step(forward, model.loss, optimizer, [batch], lr, autocast)

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
            forward = compile_model(model, backend=compile_backend) if mode == "compiled" else model
            entries.append(
                Entry(system, mode, b, cfg, counts, training_step(model, forward, optimizer, b, lr, autocast))
            )
    return entries, models, notes


def timed_step(entry: Entry, batch: Batch, device: torch.device) -> tuple[float, int]:
    """One training step of the entry: its seconds and the graphs torch compiled meanwhile."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    graphs, start = compiles(), synced(device)
    entry.step(batch)
    seconds = synced(device) - start
    if device.type == "cuda":
        entry.peak_bytes = max(entry.peak_bytes, torch.cuda.max_memory_allocated(device))
    return seconds, compiles() - graphs


def time_up(exc: BaseException | None) -> bool:
    """Whether TimeUp caused exc (torch.compile wraps what interrupts it in errors of its own)."""
    for _ in range(20):  # the chain of causes, not followed without end
        if exc is None or isinstance(exc, TimeUp):
            return exc is not None
        exc = exc.__cause__ or exc.__context__
    return False


def _fail(entry: Entry, exc: Exception, device: torch.device, when: str) -> None:
    entry.status = TIME_UP if time_up(exc) else failure(exc, entry.backend) + when
    if device.type == "cuda":
        torch.cuda.empty_cache()


def warm_up(
    entries: list[Entry], batches: list[Batch], device: torch.device, deadline: Deadline, backend: str | None = None
) -> None:
    """Each entry's untimed first steps, entry after entry: those under `backend` first, eager before compiled
    (compiling is slow), then the other backends'. An entry whose step raises is marked and left out of the timing,
    as are those the time limit leaves no room for (a compile still running at WARMUP_ENDS of it is abandoned)."""
    order = sorted(entries, key=lambda e: (e.backend != backend, e.mode == "compiled"))
    for entry in tqdm(order, desc="warm-up", unit="entry", leave=False):
        if deadline.past(WARMUP_STARTS):
            entry.status = TIME_UP
            continue
        try:
            with deadline.enforced(WARMUP_ENDS):
                for batch in batches:
                    seconds, graphs = timed_step(entry, batch, device)
                    entry.warmup_s, entry.warmup_compiles = entry.warmup_s + seconds, entry.warmup_compiles + graphs
        except Exception as exc:  # noqa: BLE001 - unsupported backend, out of memory, time up: that entry only
            _fail(entry, exc, device, " (in warm-up)")


def time_steps(entries: list[Entry], batches: list[Batch], device: torch.device, deadline: Deadline) -> int:
    """Timed steps of every entry still measured, all on the same batch in each repetition, the order alternating;
    returns the repetitions done. An entry that raises now loses its timing (it would cover other batches)."""
    done = 0
    for i, batch in enumerate(tqdm(batches, desc="timed steps", unit="rep", leave=False)):
        if deadline.past(TIMING_ENDS):
            break
        for entry in alternate([e for e in entries if e.status == MEASURED], i):
            try:
                seconds, graphs = timed_step(entry, batch, device)
            except Exception as exc:  # noqa: BLE001
                _fail(entry, exc, device, f" (at timed step {i + 1})")
                continue
            if graphs:
                entry.compiling.append(seconds)
            else:
                entry.times.append(seconds)
                entry.flops += training_flops(entry.cfg, entry.counts, batch.src_tokens, batch.tgt_tokens)
                entry.tgt_tokens += batch.tgt_tokens
        done = i + 1
    return done


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
                "status": e.status if e.status != MEASURED or ok else "not measured: no timed step",
                "timed_steps": len(e.times),
                "tgt_tokens_per_s": e.tgt_tokens / seconds if ok else None,
                "mfu": e.flops / seconds / peak if ok and peak else None,
                **{f"step_s_{k}": v if ok else None for k, v in percentiles(e.times).items()},
                "warmup_s": e.warmup_s,
                "warmup_compiles": e.warmup_compiles,
                "timed_compiling_steps": len(e.compiling),
                "timed_compiling_s": sum(e.compiling),
                "peak_gib": e.peak_bytes / 2**30 if e.peak_bytes else None,
            }
        )
    return rows


def reference_search(
    model: torch.nn.Module, src: torch.Tensor, extra: int, autocast: torch.dtype | None
) -> Callable[[], int]:
    """Beam 4 by the reference's beam_search (up to source length + extra); the call returns the output tokens."""

    def run() -> int:
        with torch.autocast(src.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return sum(len(h) + 1 for h in beam_search(model, src, src.eq(PAD), beam=4, extra_len=extra))

    return run


def hf_search(
    model: torch.nn.Module, src: torch.Tensor, length: int, autocast: torch.dtype | None
) -> Callable[[], int]:
    """Beam 4 by HF generate, forced to `length` new tokens; the call returns the output tokens."""
    generate = peers.hf_generate(model)

    def run() -> int:
        with torch.autocast(src.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            generate(src, 4, length)
        return src.size(0) * length

    return run


def build_searches(
    cfg: TransformerConfig,
    systems: set[str],
    src: torch.Tensor,
    extra: int,
    autocast: torch.dtype | None,
    device: torch.device,
) -> dict[str, Callable[[], int]]:
    """Beam search by fresh (untrained) models of those `systems` that decode here, the reference and HF MarianMT: a
    model trained for a few steps soon ends every hypothesis at once, which would leave nothing to time."""
    searches = {}
    torch.manual_seed(0)
    if "reference" in systems:
        searches["reference beam_search"] = reference_search(Transformer(cfg).to(device).eval(), src, extra, autocast)
    marian = peers.hf_marian(cfg) if "hf-marian" in systems else None
    if marian is not None:
        searches["HF MarianMT generate"] = hf_search(marian.to(device).eval(), src, src.size(1) + extra, autocast)
    return searches


def time_decoding(
    size: str,
    searches: dict[str, Callable[[], int]],
    reps: int,
    backend: str,
    device: torch.device,
    deadline: Deadline,
) -> list[dict]:
    """One untimed search per system, then `reps` interleaved timed ones (fewer if the time limit comes first)."""
    times: dict[str, list[float]] = {name: [] for name in searches}
    tokens, status = dict.fromkeys(searches, 0), dict.fromkeys(searches, MEASURED)
    with torch.no_grad(), sdpa_backend(backend):
        for i in tqdm(range(reps + 1), desc="beam search", unit="rep", leave=False):
            if deadline.past():
                break
            for name, run in alternate(searches.items(), i):
                if status[name] != MEASURED:
                    continue
                try:
                    start = synced(device)
                    tokens[name] = run()
                    seconds = synced(device) - start
                except Exception as exc:  # noqa: BLE001
                    status[name] = failure(exc, backend)
                    continue
                if i:  # the first search of each system is warm-up
                    times[name].append(seconds)
    rows = []
    for name, t in times.items():
        s = statistics.median(t) if t and status[name] == MEASURED else None
        rows.append(
            {
                "size": size,
                "system": name,
                "status": status[name] if status[name] != MEASURED or s else TIME_UP,
                "reps": len(t),
                "s": s,
                "output_tokens": tokens[name],
                "output_tokens_per_s": tokens[name] / s if s else None,
            }
        )
    return rows
