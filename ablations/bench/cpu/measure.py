"""`nox -s bench`: the training step and beam search of the reference beside real peers (torch.nn.Transformer, HF
MarianMT, CTranslate2), at the base size and at the cpu budget's scaled size, in one run.

Each of the reference's speed choices is also undone in turn (the UNDONE variants), so that every choice's
before/after ratio comes from the same run; repetitions are interleaved across systems, so that the machine's load
hits them alike. docs/benchmark.md says what is measured and how. Writes reports/bench.md and reports/bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from ablations.bench import peers
from ablations.bench.cpu.report import markdown
from ablations.bench.report import machine, output_path, shown_args
from ablations.bench.variants import (
    UNDONE,
    VARIANTS,
    FullReorderCache,
    StridedCrossCache,
    TorchOpsReorderCache,
    Variant,
)
from ablations.bench.workload import alternate, fixed_length_sources
from ablations.data.batching import BatchStream
from ablations.data.bpe import PAD
from ablations.data.corpora import data_dir
from ablations.grid.runner import PreparedData, prepare_data
from ablations.runs.budgets import budget, scale
from ablations.runs.options import failed
from ablations.scoring.decoding import beam_search
from ablations.training.throughput import choose_threads, gemm_flops, throughput
from ablations.training.train import loss_of, make_optimizer, train_step
from model import Parts, Transformer, TransformerConfig, count_parameters, kernels
from model.attention import attend_with_torch_ops
from model.batch import Batch
from model.objective import ADAM_BETAS, ADAM_EPS
from model.registry import parse_config_overrides
from plumbing.cli import check_counts
from plumbing.files import write_atomic
from plumbing.stopping import stops_cleanly

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def scaled(cfg: TransformerConfig, vocab: int) -> TransformerConfig:
    """cfg at the cpu budget's sizes (every size / 8) with a vocabulary of `vocab`."""
    return scale(cfg, budget("cpu"), vocab, "--config")


def optimizer_for(variant: Variant, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The reference's fused Adam, or the foreach or per-parameter Adam of a variant that undoes it."""
    if variant.adam == "fused":
        return make_optimizer(model, torch.device("cpu"))
    return torch.optim.Adam(
        model.parameters(), lr=0.0, betas=ADAM_BETAS, eps=ADAM_EPS, foreach=variant.adam == "foreach"
    )


def training_systems(
    size: str, cfg: TransformerConfig, threads: int, clock: Callable[[], float]
) -> tuple[dict[str, tuple], list[str]]:
    """(model, optimizer, thread count, parameter counts) of every variant at `size`, and the skipped ones' lines.
    Timed by CPU time, the variants on torch's default thread count are left out: more threads buy wall-clock time."""
    systems, skipped, default_threads = {}, [], os.cpu_count() or 1
    for v in (v for v in VARIANTS if size in v.sizes):
        if v.default_threads and clock is not time.perf_counter:
            skipped.append(f"{v.name}: not timed with --clock cpu (a thread count changes wall-clock time, not work)")
            continue
        torch.manual_seed(0)
        model = v.build(cfg)
        if model is None:
            skipped.append(f"{v.name}: {peers.MISSING}")
            continue
        model.train()
        systems[v.name] = (
            model,
            optimizer_for(v, model),
            default_threads if v.default_threads else threads,
            count_parameters(model.parameter_groups()),
        )
    return systems, skipped


def time_training(
    size: str, systems: dict[str, tuple], batches: list[Batch], warmup: int, clock: Callable[[], float]
) -> tuple[dict[str, list[float]], dict[int, list[float]]]:
    """Each system's step times after `warmup` steps, interleaved, and the GEMM rates at each thread count measured
    before every repetition, so that a change of the machine's load enters both alike."""
    times: dict[str, list[float]] = {name: [] for name in systems}
    gemm: dict[int, list[float]] = {}
    for i, batch in enumerate(tqdm(batches, desc=f"train {size}", unit="rep", leave=False)):
        for n in sorted({s[2] for s in systems.values()}):
            torch.set_num_threads(n)
            gemm.setdefault(n, []).append(gemm_flops(torch.device("cpu"), clock=clock))
        for name, (model, optimizer, n, _) in alternate(systems.items(), i):
            torch.set_num_threads(n)
            start = clock()
            train_step(model, loss_of(model), optimizer, [batch], 1e-4)
            if i >= warmup:
                times[name].append(clock() - start)
    return times, gemm


def bench_training(
    size: str,
    cfg: TransformerConfig,
    batches: list[Batch],
    warmup: int,
    threads: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[dict], list[str]]:
    """Interleaved training steps of every variant on the same batches; returns results and skipped-peer lines."""
    systems, skipped = training_systems(size, cfg, threads, clock)
    times, gemm = time_training(size, systems, batches, warmup, clock)
    torch.set_num_threads(threads)
    timed = batches[warmup:]
    src, tgt = statistics.mean(b.src_tokens for b in timed), statistics.mean(b.tgt_tokens for b in timed)
    results = []
    for name, (_, _, n, counts) in systems.items():
        step = statistics.median(times[name])
        results.append(
            {
                "size": size,
                "variant": name,
                "threads": n,
                "step_s": step,
                "gemm_flops_per_s": statistics.median(gemm[n]),
                **throughput(cfg, counts, src, tgt, step, statistics.median(gemm[n])),
            }
        )
    return results, skipped


def beam_searcher(model: Transformer, src: torch.Tensor, extra: int) -> Callable[[], object]:
    """Beam 4 by model over src, up to src length + extra output tokens: one timed call (its padding mask included)."""
    return lambda: beam_search(model, src, src.eq(PAD), beam=4, extra_len=extra)


def decoding_models(cfg: TransformerConfig) -> dict[str, Transformer]:
    """The reference and its UNDONE decoding variants, by name, all with the reference's weights, so that every one
    decodes the same hypotheses."""
    torch.manual_seed(0)
    reference = Transformer(cfg).eval()
    copied = Transformer(cfg).eval()
    copied.beams_share_memory = False  # the memory repeated per beam, its keys and values reordered every step
    full_reorder = Transformer(cfg).eval()
    full_reorder.new_cache = FullReorderCache
    strided = Transformer(cfg).eval()
    strided.new_cache = StridedCrossCache
    torch_ops = Transformer(cfg, Parts(attend=attend_with_torch_ops)).eval()
    torch_reorder = Transformer(cfg).eval()
    torch_reorder.new_cache = TorchOpsReorderCache
    for other in (copied, full_reorder, strided, torch_ops, torch_reorder):
        other.load_state_dict(reference.state_dict())
    return {
        "reference": reference,
        UNDONE + "attention through torch ops, no fused kernel": torch_ops,
        UNDONE + "cache rows moved by torch ops (gather, then write back)": torch_reorder,
        UNDONE + "cross-attention keys/values per beam": copied,
        UNDONE + "every cached row copied at each step": full_reorder,
        UNDONE + "cross-attention keys/values strided": strided,
    }


def peer_decoders(
    cfg: TransformerConfig, src: torch.Tensor, out_len: int, threads: int
) -> tuple[dict[str, Callable[[], object]], list[str]]:
    """HF MarianMT's generate and CTranslate2 on a Marian model of cfg's sizes, where installed; the missing ones' lines."""
    marian = peers.hf_marian(cfg)
    if marian is None:
        return {}, [f"HF generate: {peers.MISSING}", f"CTranslate2: {peers.MISSING}"]
    marian.eval()
    generate = peers.hf_generate(marian)
    systems: dict[str, Callable[[], object]] = {"HF MarianMT generate, same dims": lambda: generate(src, 4, out_len)}
    ct2 = peers.ctranslate2_decoder(marian, threads)
    if ct2 is None:
        return systems, [f"CTranslate2: {peers.MISSING}"]
    systems["CTranslate2 fp32, same Marian model"] = lambda: ct2(src, 4, out_len)
    return systems, []


def time_decoding(
    size: str, systems: dict[str, Callable[[], object]], reps: int, clock: Callable[[], float]
) -> dict[str, list[float]]:
    """Each system's time of every repetition, the systems interleaved, so that the machine's load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in systems}
    with torch.no_grad():
        for i in tqdm(range(reps), desc=f"decode {size}", unit="rep", leave=False):
            for name, run in alternate(systems.items(), i):
                start = clock()
                run()
                times[name].append(clock() - start)
    return times


def bench_decoding(
    size: str,
    cfg: TransformerConfig,
    src: torch.Tensor,
    extra: int,
    reps: int,
    threads: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[dict], list[str]]:
    """Beam 4 by every system on the same sources, each forced to src length + extra output tokens."""
    systems = {name: beam_searcher(model, src, extra) for name, model in decoding_models(cfg).items()}
    out_len = src.size(1) + extra
    peer_systems, skipped = peer_decoders(cfg, src, out_len, threads)
    times = time_decoding(size, {**systems, **peer_systems}, reps, clock)
    tokens = src.size(0) * out_len
    return [
        {
            "size": size,
            "system": name,
            "threads": threads,
            "sentences": src.size(0),
            "output_length": out_len,
            "s": statistics.median(t),
            "output_tokens_per_s": tokens / statistics.median(t),
        }
        for name, t in times.items()
    ], skipped


def parser() -> argparse.ArgumentParser:
    """The bench's flags: the data, the sizes and config, and how many steps, sources and repetitions are timed."""
    parser = argparse.ArgumentParser(prog="python -m ablations.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    parser.add_argument(
        "--preset", default="multi30k", help="data preset whose dev set gives the batches (default multi30k)"
    )
    parser.add_argument("--runs", default="runs", help="where the BPE cache lives")
    parser.add_argument("--sizes", default="base,scaled", help="base, scaled (every size / 8) or both (default)")
    parser.add_argument(
        "--config", default="", help="overrides of the base config, e.g. N=2 (the scaled size is derived from it)"
    )
    cpu = budget("cpu")
    parser.add_argument(
        "--vocab",
        type=int,
        default=cpu.vocab_size,
        help=f"BPE size: the scaled models' vocabulary (default {cpu.vocab_size}, the cpu budget's)",
    )
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: by model size and load)")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps (default 5 at base, 12 scaled)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps (default 1)")
    parser.add_argument("--batch-tokens", type=int, default=2000, help="positions per side per step (default 2000)")
    parser.add_argument(
        "--decode-sentences", type=int, default=None, help="sources to beam-search (default 8 at base, 32 scaled)"
    )
    parser.add_argument("--decode-length", type=int, default=20, help="tokens per source (default 20)")
    parser.add_argument("--extra", type=int, default=50, help="output tokens beyond the source length (default 50)")
    parser.add_argument("--decode-reps", type=int, default=5, help="interleaved decoding repetitions (default 5)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall (default), or cpu: this process's CPU time, which other processes' load does not enter",
    )
    parser.add_argument("--out", default=str(Path("reports") / "bench.md"))
    return parser


def sizes_chosen(args: argparse.Namespace) -> list[tuple[str, TransformerConfig]]:
    """The sizes --sizes names, in its order, each with its config: base (with --config) and scaled from it."""
    base = TransformerConfig().replace(**parse_config_overrides(args.config, "--config"))
    sizes = {"base": base, "scaled": scaled(base, args.vocab)}
    chosen = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not chosen or set(chosen) - set(sizes):
        raise ValueError(f"--sizes {args.sizes!r}: choose from base, scaled")
    return [(size, sizes[size]) for size in chosen]


def measured_under(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """What the run is measured under (machine, load, kernels, flags); builds the attention kernel first, so that no
    timed search includes the build."""
    built = kernels.compiled() is not None
    return {
        **machine(),
        "attention_kernel": "in use" if built else f"not built (torch ops; see stderr, or {kernels.SWITCH})",
        "load_before": os.getloadavg()[0],
        "clock": args.clock,
        "preset": args.preset,
        "vocab": args.vocab,
        "batch_tokens": args.batch_tokens,
        "warmup": args.warmup,
        "decode_length": args.decode_length,
        "extra": args.extra,
        "args": shown_args(argv if argv is not None else sys.argv[1:]),
    }


def bench_sizes(
    args: argparse.Namespace,
    chosen: list[tuple[str, TransformerConfig]],
    data: PreparedData,
    sources: dict[str, torch.Tensor],
    meta: dict,
) -> tuple[list[dict], list[dict], list[str]]:
    """Training and decoding results at each chosen size, and the skipped lines; adds to meta each size's step count,
    the load at the end and the thread counts."""
    training, decoding, skipped, threads = [], [], [], {}
    for size, cfg in chosen:
        threads[size] = choose_threads(cfg, args.threads)
        torch.set_num_threads(threads[size])
        steps = args.steps or (5 if size == "base" else 12)
        stream = BatchStream(data.train_src, data.train_tgt, args.batch_tokens, seed=0)  # as training draws them
        rows, missing = bench_training(
            size,
            cfg,
            [stream.next() for _ in range(args.warmup + steps)],
            args.warmup,
            threads[size],
            CLOCKS[args.clock],
        )
        training += rows
        rows, missing_decoders = bench_decoding(
            size, cfg, sources[size], args.extra, args.decode_reps, threads[size], CLOCKS[args.clock]
        )
        decoding += rows
        skipped += [line for line in missing + missing_decoders if line not in skipped]
        meta[f"steps_{size}"] = steps
    meta.update(load_after=os.getloadavg()[0], threads=", ".join(f"{n} at {s}" for s, n in threads.items()))
    return training, decoding, skipped


@stops_cleanly("nothing written (an earlier report is as it was); run the same command again")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_counts(
            ("--steps", args.steps),
            ("--decode-sentences", args.decode_sentences),
            ("--decode-length", args.decode_length),
            ("--decode-reps", args.decode_reps),
            ("--batch-tokens", args.batch_tokens),
            ("--threads", args.threads),
        )
        chosen = sizes_chosen(args)
        out = output_path(args.out)
        b = budget("smoke").replace(vocab_size=args.vocab, max_train_pairs=None, dev_pairs=None)
        data = prepare_data(b, args.preset, data_dir(args.data), Path(args.runs))
        sources = {
            size: fixed_length_sources(
                data.dev_src, args.decode_sentences or (8 if size == "base" else 32), args.decode_length
            )
            for size, _ in chosen
        }
    except ValueError as exc:  # a bad flag value, DataError, a bad --config or --sizes
        return failed(exc)
    meta = measured_under(args, argv)
    training, decoding, skipped = bench_sizes(args, chosen, data, sources, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, markdown(meta, training, decoding, skipped))  # atomic: a stop never leaves half a report
    write_atomic(
        out.with_suffix(".json"),
        json.dumps({**meta, "training": training, "decoding": decoding, "skipped": skipped}, indent=2) + "\n",
    )
    print(out.read_text())
    return 0
