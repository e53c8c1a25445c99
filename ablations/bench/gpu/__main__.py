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

import sys
import time
from typing import Callable

import torch

from ablations.bench.gpu.decoding import build_searches, time_decoding
from ablations.bench.gpu.options import SIZES, BenchOptions, parse
from ablations.bench.gpu.profiling import profile_entry
from ablations.bench.gpu.report import Progress
from ablations.bench.gpu.timing import (
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
from ablations.bench.report import machine
from ablations.bench.shapes import stream_shapes
from ablations.bench.variants import VARIANTS
from ablations.bench.workload import fixed_length_sources
from ablations.data.batching import BatchStream
from ablations.grid.prepared import load_prepared, save_prepared
from ablations.grid.runner import PreparedData, describe_device, prepare_data
from ablations.runs.budgets import BF16_WEIGHTS, budget, row_config, select_rows
from ablations.runs.options import FORESEEN, failed
from ablations.training.peaks import peak_flops
from ablations.training.precision import for_training
from ablations.training.train import make_optimizer
from model import TransformerConfig, count_parameters
from model.batch import Batch
from plumbing.files import StorageError
from plumbing.stopping import Stopped, stops_cleanly


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
