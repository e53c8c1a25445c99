"""`python -m ablations.bench.gpu --device cuda` (nox -s bench_gpu): the training step of the reference, the
torch.nn.Transformer adapter and HF MarianMT on one GPU, eager and compiled, bf16 autocast and fused Adam, at the
base and big sizes of the short budget; beam search beside HF generate; on request (--backends), the other attention
backends, eager.

Every system trains on the same real training batches of the short budget (its data and BPE, lengths as they come,
padded to multiples of 8 as the runner pads them), repetitions interleaved across systems. Step times are reported
as p50/p99/max with warm-up and compiling apart, clocked as the runner clocks its steps (CUDA events, no wait between
steps), and MFU against the card's bf16 dense peak; one more step of the reference, eager and compiled, is profiled
(its top kernels). `--device cpu --sizes tiny` runs the same code in seconds (fp32, no MFU: there is no bf16 peak to
hold a CPU to). Writes reports/bench-gpu.md and reports/bench-gpu.json, from the start and at every stage
(ablations/bench/gpu/report.py's Progress); docs/benchmark.md ("On a GPU") says what is measured. `--prepared DIR`
loads the data that ablations/grid/prepared.py saved there (the GPU check's --prepare), so that no BPE is trained on
the GPU's clock.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ablations.bench.gpu.decoding import build_searches, time_decoding
from ablations.bench.gpu.profiling import profile_entry
from ablations.bench.gpu.report import Progress
from ablations.bench.gpu.timing import (
    MODES,
    SYSTEMS,
    Deadline,
    Entry,
    build_entries,
    measure_compiled,
    one_line,
    time_steps,
    training_step,
    training_rows,
    warm_up,
)
from ablations.bench.report import machine, output_path, shown_args
from ablations.bench.shapes import stream_shapes
from ablations.bench.variants import VARIANTS
from ablations.bench.workload import fixed_length_sources
from ablations.data.batching import BatchStream
from ablations.data.corpora import data_dir
from ablations.grid.prepared import load_prepared, save_prepared
from ablations.grid.runner import PreparedData, describe_device, prepare_data
from ablations.runs.budgets import BF16_WEIGHTS, budget, row_config, select_rows
from ablations.runs.options import FORESEEN, failed
from ablations.training.backends import SDPA_BACKENDS
from ablations.training.peaks import peak_flops
from ablations.training.precision import for_training
from ablations.training.train import make_optimizer
from model import TransformerConfig, count_parameters
from model.batch import Batch
from plumbing.cli import OneLineParser, check_counts, resolve_device
from plumbing.files import StorageError
from plumbing.stopping import Stopped, stops_cleanly

# A size: the budget whose data, BPE, batch size and scale it takes, and the Table 3 row it trains.
SIZES = {"base": ("short", "base"), "big": ("short", "big"), "tiny": ("smoke", "base")}


@dataclass(frozen=True)
class BenchOptions:
    """What to measure, every value checked; the defaults differ by device (see `parse`)."""

    device: torch.device
    sizes: tuple[str, ...]
    systems: tuple[str, ...]
    modes: tuple[str, ...]
    backend: str  # attention backend of every mode's entry
    backends: tuple[str, ...]  # compared with it, eager
    precision: str  # bf16 (autocast) or fp32
    steps: int
    warmup: int
    batch_tokens: int | None  # None: the size's budget's
    pad_multiple: int | None  # None: the size's budget's
    compile_backend: str
    decode_sentences: int
    decode_length: int
    extra: int
    decode_reps: int
    time_limit: float | None
    compile_estimate: float  # seconds a compile is taken to need until one is measured
    data: Path
    runs: Path
    prepared: Path | None  # where ablations/grid/prepared.py saved the data (None: read and encode it here)
    out: Path
    args: str

    @property
    def autocast(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None


def choose(flag: str, text: str, allowed: tuple[str, ...], empty: bool = False) -> tuple[str, ...]:
    """A comma list of names from `allowed`, each once; a one-line ValueError naming the flag otherwise."""
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    wrong = [c for c in chosen if c not in allowed]
    if wrong or not (chosen or empty):
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(allowed)}" + (" (or nothing)" if empty else ""))
    return chosen


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations.bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    p.add_argument("--runs", default="runs", help="where the BPE cache lives (default runs)")
    p.add_argument("--prepared", help="load the encoded data saved in this folder (else prepare it, and save it there)")
    p.add_argument("--sizes", help=f"{', '.join(SIZES)} (default base,big on a GPU, tiny on the CPU)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"default {','.join(SYSTEMS)}")
    p.add_argument("--modes", help="eager, compiled (default both on a GPU, eager on the CPU)")
    p.add_argument("--backend", help="attention backend of every mode (default efficient on a GPU, as the runner)")
    p.add_argument("--backends", help="backends compared with it, eager: a comma list, or all (default none)")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="default bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--steps", type=int, default=20, help="timed steps per entry (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps per entry (default 3)")
    p.add_argument("--batch-tokens", type=int, help="positions per side per step (default: the size's budget's)")
    p.add_argument("--pad-multiple", type=int, help="pad lengths to a multiple of this (default: the budget's)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (default inductor)")
    p.add_argument("--decode-sentences", type=int, help="sources to beam-search (default 32; 4 on the CPU)")
    p.add_argument("--decode-length", type=int, help="tokens per source (default 20; 8 on the CPU)")
    p.add_argument("--extra", type=int, help="output tokens beyond the source (default 50; 10 on the CPU)")
    p.add_argument("--decode-reps", type=int, default=3, help="timed beam searches per system (default 3)")
    p.add_argument("--time-limit", type=float, help="seconds from when the data is ready: none after it (default none)")
    p.add_argument("--compile-estimate", type=float, default=60.0, help="seconds a compile needs (default 60)")
    p.add_argument("--out", default=str(Path("reports") / "bench-gpu.md"))
    return p


def parse(argv: list[str]) -> BenchOptions:
    """The options, checked before any work: a one-line ValueError (or DataError) naming the flag and the fix."""
    a = parser().parse_args(argv)
    check_counts(
        ("--steps", a.steps),
        ("--warmup", a.warmup),
        ("--batch-tokens", a.batch_tokens),
        ("--pad-multiple", a.pad_multiple),
        ("--decode-sentences", a.decode_sentences),
        ("--decode-length", a.decode_length),
        ("--extra", a.extra),
        ("--decode-reps", a.decode_reps),
    )
    if a.time_limit is not None and not a.time_limit > 0:
        raise ValueError(f"--time-limit {a.time_limit}: give a number of seconds above 0")
    if not a.compile_estimate >= 0:
        raise ValueError(f"--compile-estimate {a.compile_estimate}: give a number of seconds, 0 or more")
    if a.prepared and Path(a.prepared).is_file():
        raise ValueError(f"--prepared {a.prepared} is a file; give the folder the data was prepared in")
    device = resolve_device(a.device)
    gpu = device.type == "cuda"
    backend = choose("--backend", a.backend or ("efficient" if gpu else "default"), SDPA_BACKENDS)
    if len(backend) != 1:
        raise ValueError(f"--backend {a.backend!r}: give one of {', '.join(SDPA_BACKENDS)}")
    backends = ",".join(SDPA_BACKENDS) if a.backends == "all" else a.backends or ""  # others only on request
    return BenchOptions(
        device=device,
        sizes=choose("--sizes", a.sizes or ("base,big" if gpu else "tiny"), tuple(SIZES)),
        systems=choose("--systems", a.systems, tuple(SYSTEMS)),
        modes=choose("--modes", a.modes or ("eager,compiled" if gpu else "eager"), MODES),
        backend=backend[0],
        backends=choose("--backends", backends, SDPA_BACKENDS, empty=True),
        precision=a.precision or ("bf16" if gpu else "fp32"),
        steps=a.steps,
        warmup=a.warmup,
        batch_tokens=a.batch_tokens,
        pad_multiple=a.pad_multiple,
        compile_backend=a.compile_backend,
        decode_sentences=a.decode_sentences or (32 if gpu else 4),
        decode_length=a.decode_length or (20 if gpu else 8),
        extra=a.extra or (50 if gpu else 10),
        decode_reps=a.decode_reps,
        time_limit=a.time_limit,
        compile_estimate=a.compile_estimate,
        data=data_dir(a.data),
        runs=Path(a.runs),
        prepared=Path(a.prepared) if a.prepared else None,
        out=output_path(a.out),
        args=shown_args(argv),
    )


def batches_of(size: str, data: PreparedData, o: BenchOptions) -> tuple[list, dict]:
    """warmup + steps training batches of the size's budget, on the device, and what they hold (for the report)."""
    b = budget(SIZES[size][0])
    tokens, pad = o.batch_tokens or b.batch_tokens, o.pad_multiple or b.pad_multiple
    stream = BatchStream(data.train_src, data.train_tgt, tokens, seed=0, pad_multiple=pad)
    batches = [stream.next() for _ in range(o.warmup + o.steps)]
    timed = batches[o.warmup :]
    about = {
        "size": size,
        "preset": data.preset,
        "vocab": data.sp.get_piece_size(),
        "batch_tokens": tokens,
        "pad_multiple": pad,
        **stream_shapes(timed),
        "mean_tgt_tokens": sum(x.tgt_tokens for x in timed) / len(timed),
        "timed_reps": 0,  # the eager entries' repetitions, once timed
    }
    batches = [x.to(o.device) for x in batches]
    for x in batches:  # counted now: the first step to read them would otherwise wait for the GPU
        x.src_tokens, x.tgt_tokens
    return batches, about


def load_data(o: BenchOptions) -> tuple[dict[str, PreparedData], dict[str, str]]:
    """The data of every budget the sizes take, loaded from --prepared or prepared here (and saved there), checked to
    hold enough dev sources; and how each was had, for the report."""
    data, how = {}, {}
    for size in o.sizes:
        name = SIZES[size][0]
        if name in data:
            continue
        start = time.perf_counter()
        data[name] = load_prepared(o.prepared, name) if o.prepared else None
        if data[name] is not None:
            how[name] = f"loaded from {o.prepared / name} (--prepared)"
        else:
            data[name] = prepare_data(budget(name), budget(name).preset, o.data, o.runs)
            saved = f", saved to {save_prepared(data[name], o.prepared, name)}" if o.prepared else ""
            how[name] = f"read, BPE-encoded (BPE cache {o.runs / 'cache'}){saved}"
        how[name] += f" in {time.perf_counter() - start:.1f} s"
        fixed_length_sources(data[name].dev_src, o.decode_sentences, o.decode_length)  # enough sources, or say so
    return data, how


def size_setup(size: str, data: PreparedData, o: BenchOptions) -> tuple[TransformerConfig, list, dict]:
    """The size's model config, its batches on the device, and what they hold."""
    b, row = budget(SIZES[size][0]), select_rows(SIZES[size][1])[0]
    return (row_config(row, b, data.sp.get_piece_size()), *batches_of(size, data, o))


def freed(device: torch.device) -> None:
    """The GPU's memory of models no longer referenced handed back, for the next models."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reporter(size: str, entries: list[Entry], o: BenchOptions, progress: Progress) -> Callable[[str], None]:
    """What the measuring calls after each stage: the entries' rows as they stand, written with the stage."""
    peak = peak_flops(o.device) if o.precision == "bf16" else None

    def report(stage: str) -> None:
        progress.add_training(training_rows(size, entries, peak))
        progress.write("partial", f"after the {stage} ({size})")

    return report


def measure_eager(size: str, data: PreparedData, o: BenchOptions, deadline: Deadline, progress: Progress) -> dict:
    """The size's eager entries (warm-up, then timed steps interleaved), then its beam searches, all reported as they
    come; returns the seconds each system's eager steps under --backend took (the compiled phase budgets by them)."""
    cfg, batches, about = size_setup(size, data, o)
    eager = ("eager",) if "eager" in o.modes else ()
    entries, models, notes = build_entries(cfg, o.systems, eager, o.backend, o.backends, o.device, o.autocast)
    entries += [bf16_weights_entry(cfg, o)] if times_bf16_weights(o) else []
    progress.meta["batches"].append(about)
    progress.notes += [f"{size}: {n}" for n in notes]
    report = reporter(size, entries, o, progress)
    warm_up(entries, batches[: o.warmup], o.device, deadline, o.backend, report)
    about["timed_reps"] = time_steps(entries, batches[o.warmup :], o.device, deadline)
    report("eager timed steps")
    profile(size, entries, batches[-1], o, deadline, progress)
    eager_s = {e.system: sum(e.times) for e in entries if e.backend == o.backend}
    built = set(models)
    del entries, models, report
    freed(o.device)
    src = fixed_length_sources(data.dev_src, o.decode_sentences, o.decode_length).to(o.device)
    searches = build_searches(cfg, built, src, o.extra, o.autocast, o.device)
    progress.decoding += time_decoding(size, searches, o.decode_reps, o.backend, o.device, deadline)
    progress.write("partial", f"after the beam searches ({size})")
    return eager_s


def times_bf16_weights(o: BenchOptions) -> bool:
    """Whether the reference's eager step is also timed with bf16 weights: beside its step under bf16 autocast."""
    return o.precision == "bf16" and "reference" in o.systems and "eager" in o.modes


def bf16_weights_entry(cfg: TransformerConfig, o: BenchOptions) -> Entry:
    """The reference's eager step as the runner takes it on a GPU: a bf16 copy of a model of the same seed steps its
    fp32 master weights (ablations/training/precision.py), under --backend, interleaved with the other entries."""
    torch.manual_seed(0)
    model = next(v.build for v in VARIANTS if v.name == SYSTEMS["reference"])(cfg).to(o.device).train()
    working, optimizer = for_training(model, make_optimizer(model, o.device), BF16_WEIGHTS)
    step = training_step(model, working, optimizer, o.backend, 1e-4, None)
    return Entry("reference", "eager", o.backend, cfg, count_parameters(model.parameter_groups()), step, "bf16 weights")


def profile(
    size: str, entries: list[Entry], batch: Batch, o: BenchOptions, deadline: Deadline, progress: Progress
) -> None:
    """One more step of the reference's entry under --backend, profiled (ablations/bench/gpu/profiling.py), into the
    report: where that step's time goes."""
    ours = next((e for e in entries if e.system == "reference" and e.backend == o.backend), None)
    if ours is not None:
        progress.profiles.append(profile_entry(ours, size, batch, o.device, deadline))
        progress.write("partial", f"after profiling the reference's {ours.mode} step ({size})")


def compiled_order(systems: tuple[str, ...]) -> tuple[str, ...]:
    """The systems in the order they compile: the reference and HF Marian first, whose compiled steps the targets
    compare, since the time left may hold only two compiles."""
    first = tuple(s for s in ("reference", "hf-marian") if s in systems)
    return (*first, *(s for s in systems if s not in first))


def measure_compiled_size(
    size: str, data: PreparedData, o: BenchOptions, deadline: Deadline, progress: Progress, eager_s: dict
) -> None:
    """The size's compiled entries, on fresh models of the same seed, one after another (measure_compiled)."""
    cfg, batches, _ = size_setup(size, data, o)
    systems = compiled_order(o.systems)
    entries, _, _ = build_entries(cfg, systems, ("compiled",), o.backend, (), o.device, o.autocast, o.compile_backend)
    report = reporter(size, entries, o, progress)
    report("building of the compiled entries")
    measure_compiled(entries, batches, o.warmup, o.device, deadline, o.compile_estimate, eager_s, report)
    profile(size, entries, batches[-1], o, deadline, progress)
    del entries, report
    freed(o.device)
    torch._dynamo.reset()  # the next size's models compile afresh, not against this size's cache limit


def settings_of(o: BenchOptions) -> dict:
    """The run's settings, as its report shows them from its first write."""
    meta = machine()
    return {
        **meta,
        "started_at": meta["date"],
        "device": describe_device(o.device),
        "peak_bf16_flops": peak_flops(o.device),
        "precision": o.precision,
        "bf16_weights": times_bf16_weights(o),
        "sizes": list(o.sizes),
        "systems": list(o.systems),
        "modes": list(o.modes),
        "backend": o.backend,
        "backends": list(o.backends),
        "compile_backend": o.compile_backend,
        "compile_estimate": o.compile_estimate,
        "warmup": o.warmup,
        "steps": o.steps,
        "decode": {"sentences": o.decode_sentences, "length": o.decode_length, "extra": o.extra, "reps": o.decode_reps},
        "time_limit": o.time_limit,
        "prepare_s": 0.0,
        "data_from": {},
        "batches": [],
        "args": o.args,
    }


def measure(o: BenchOptions, progress: Progress) -> None:
    """Read the data (timed apart), then every size's eager entries and beam searches, then its compiled entries:
    no compile runs beside a timed eager step, and every entry's eager rows come before any compile."""
    start = time.perf_counter()
    data, progress.meta["data_from"] = load_data(o)
    progress.meta["prepare_s"] = time.perf_counter() - start
    deadline = Deadline(o.time_limit)  # from now: the data is ready
    progress.write("partial", "after reading the data")
    if o.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as the runner
    eager_s = {size: measure_eager(size, data[SIZES[size][0]], o, deadline, progress) for size in o.sizes}
    if "compiled" in o.modes:
        for size in o.sizes:
            measure_compiled_size(size, data[SIZES[size][0]], o, deadline, progress, eager_s[size])


@stops_cleanly("the report holds what was measured before the stop; run the same command again")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        o = parse(argv)
        progress = Progress(o.out, settings_of(o))
        progress.write("started", "reading the data")  # an earlier run's report is gone from here on
    except FORESEEN as exc:  # a bad flag value, a missing data folder: one line
        return failed(exc)
    try:
        measure(o, progress)
    except Stopped as stop:
        progress.write("stopped", str(stop))
        raise
    except Exception as exc:  # noqa: BLE001 - whatever ended the run, its report says so (unless it cannot be written)
        if not isinstance(exc, StorageError):
            progress.write("failed", one_line(exc))
        if isinstance(exc, FORESEEN):  # the data unreadable, a report that cannot be written: one line
            return failed(exc)
        raise
    progress.write("complete")
    print(o.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
