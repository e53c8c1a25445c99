"""`python -m ablations.bench.cpu.profiling`: where the time of the CPU budget's training step and of beam search goes.

Shares of CPU time by kind of operation (torch.profiler, self time of each aten op), for the scaled base model (the
cpu budget's sizes and vocabulary) on one thread: a training step on Multi30k training batches of the budget's size, and
beam search (beam 4, sources of fixed length, every hypothesis forced to the same output length, as in the
benchmark). It also times beam search with a model of width d_model / 8 beside the scaled one: what does not shrink
with the width is fixed cost per operation (Python, dispatch), not arithmetic. Writes reports/profile.md, the
figures docs/benchmark.md quotes.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from ablations.bench.cpu.measure import CLOCKS, beam_searcher, scaled
from ablations.bench.report import machine, output_path
from ablations.bench.workload import fixed_length_sources
from ablations.data.batching import BatchStream
from ablations.data.corpora import data_dir
from ablations.grid.runner import prepare_data
from ablations.runs.budgets import budget
from ablations.runs.options import failed
from ablations.training.throughput import median_seconds
from ablations.training.train import loss_of, make_optimizer, train_step
from model import Transformer, TransformerConfig, kernels
from model.batch import Batch
from plumbing.cli import check_counts
from plumbing.files import write_atomic
from plumbing.stopping import stops_cleanly

KINDS: dict[str, tuple[str, ...]] = {  # kind -> aten ops (self time); every other op counts as "other"
    "GEMM (mm, bmm, addmm)": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"),
    "softmax": ("aten::_softmax", "aten::_softmax_backward_data"),
    "log-softmax, loss": (
        "aten::_log_softmax",
        "aten::_log_softmax_backward_data",
        "aten::exp",
        "aten::log",
        "aten::logsumexp",
        "aten::gather",
        "aten::scatter",
        "aten::scatter_add_",
        kernels.LOSS_PROFILER_NAME,
    ),
    "dropout masks": ("aten::bernoulli_", "aten::native_dropout", "aten::native_dropout_backward"),
    "copies, gathers, cache writes": (
        "aten::copy_",
        "aten::index_select",
        "aten::index_copy_",
        "aten::cat",
        "aten::index",
        "aten::embedding_dense_backward",
        "aten::fill_",
        "aten::zero_",
        kernels.REORDER_PROFILER_NAME,
    ),
    "LayerNorm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "top-k over the vocabulary": ("aten::topk", "aten::sort"),
    "optimizer (fused Adam)": ("aten::_fused_adam_",),
    "attention of a decoding step (fused kernel)": (kernels.PROFILER_NAME,),
    "attention, narrow heads (fused kernel, forward and backward)": (kernels.NARROW_PROFILER_NAME,),
}


def shares(work: Callable[[], object]) -> dict[str, float]:
    """Share of the ops' self CPU time per kind, over one profiled call of work (after one untimed call)."""
    work()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
    kind_of = {op: kind for kind, ops in KINDS.items() for op in ops}
    times: dict[str, float] = defaultdict(float)
    ops = [e for e in prof.key_averages() if e.key.startswith(("aten::", "aiayn::"))]  # aiayn: the kernels' calls
    for event in ops:  # not other annotations, nor autograd's nodes
        times[kind_of.get(event.key, "other (elementwise, reductions, views)")] += event.self_cpu_time_total
    total = sum(times.values())
    return {kind: t / total for kind, t in sorted(times.items(), key=lambda item: -item[1])}


def table(title: str, share: dict[str, float]) -> list[str]:
    """A markdown table of the share of each kind of operation, largest first, and the blank line after it."""
    return [f"| {title} | share of op time |", "|---|---|", *(f"| {kind} | {s:.1%} |" for kind, s in share.items()), ""]


def parser() -> argparse.ArgumentParser:
    """The profile's flags: the data, and how many training steps and which sources it profiles."""
    parser = argparse.ArgumentParser(prog="python -m ablations.bench.cpu.profiling", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    parser.add_argument("--runs", default="runs", help="where the BPE cache lives")
    parser.add_argument("--steps", type=int, default=20, help="training steps profiled and timed (default 20)")
    parser.add_argument("--decode-sentences", type=int, default=32, help="sources to beam-search (default 32)")
    parser.add_argument("--decode-length", type=int, default=20, help="tokens per source (default 20)")
    parser.add_argument("--extra", type=int, default=50, help="output tokens beyond the source length (default 50)")
    parser.add_argument("--out", default=str(Path("reports") / "profile.md"))
    return parser


def decoding_profile(
    wide: Transformer, narrow: Transformer, src: torch.Tensor, extra: int
) -> tuple[dict[str, float], float, float]:
    """Op-time shares of beam search by `wide`, and its CPU seconds beside `narrow`'s (medians of 3): what does not
    shrink with the width is fixed cost per operation."""
    with torch.no_grad():
        decode_shares = shares(beam_searcher(wide.eval(), src, extra))
        wide_s, narrow_s = (
            median_seconds(beam_searcher(m.eval(), src, extra), 3, CLOCKS["cpu"]) for m in (wide, narrow)
        )
    return decode_shares, wide_s, narrow_s


def training_profile(
    model: Transformer, optimizer: torch.optim.Optimizer, batches: list[Batch]
) -> tuple[dict[str, float], float]:
    """Op-time shares of training steps on `batches`, and the CPU seconds per step over one timed pass."""

    def train() -> None:
        model.train()
        for batch in batches:
            train_step(model, loss_of(model), optimizer, [batch], 1e-4)

    return shares(train), median_seconds(train, 1, CLOCKS["cpu"]) / len(batches)


@stops_cleanly("nothing written (an earlier report is as it was); run the same command again")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cpu = budget("cpu")
    try:
        check_counts(
            ("--steps", args.steps),
            ("--decode-sentences", args.decode_sentences),
            ("--decode-length", args.decode_length),
        )
        out = output_path(args.out)
        b = budget("smoke").replace(vocab_size=cpu.vocab_size, max_train_pairs=None, dev_pairs=None)
        data = prepare_data(b, "multi30k", data_dir(args.data), Path(args.runs))
        src = fixed_length_sources(data.dev_src, args.decode_sentences, args.decode_length)
    except ValueError as exc:  # a bad flag value, DataError, too few long sources
        return failed(exc)
    torch.set_num_threads(1)
    cfg = scaled(TransformerConfig(), cpu.vocab_size)
    torch.manual_seed(0)
    model = Transformer(cfg)
    optimizer = make_optimizer(model, torch.device("cpu"))
    stream = BatchStream(data.train_src, data.train_tgt, cpu.batch_tokens, seed=0)  # as training draws them
    batches = [stream.next() for _ in range(args.steps)]
    narrow = Transformer(scaled(cfg, cfg.vocab_size))  # every size / 8 once more: d_model 8
    decode_shares, wide_s, narrow_s = decoding_profile(model, narrow, src, args.extra)
    train_shares, step_s = training_profile(model, optimizer, batches)
    meta = machine()
    command = " ".join(["python -m ablations.bench.cpu.profiling", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        "# Where the time goes: the cpu budget's training step and beam search",
        "",
        f"Generated by `{command}` on {meta['date']}, commit {meta['commit']}, {meta['cpu']}, 1 thread, torch {meta['torch']}. Shares of the",
        "self CPU time of the aten ops and of the reference's kernels (model/kernels/) (torch.profiler); Python and "
        "autograd between ops are not in them.",
        "",
        f"Training: the scaled base model (d_model {cfg.d_model}, {cfg.vocab_size}-token vocabulary), {len(batches)} steps on "
        f"Multi30k training batches of {cpu.batch_tokens} tokens, fused Adam: {step_s * 1e3:.0f} ms CPU per step.",
        "",
        *table("training step", train_shares),
        f"Beam search: beam 4, {src.size(0)} sources of {src.size(1)} tokens, {src.size(1) + args.extra} output tokens each: "
        f"{wide_s:.2f} s CPU. The same search with d_model {cfg.d_model // 8} (every size / 8 once more: 1/64 of the "
        f"arithmetic in the layers' linear maps, 1/8 in attention and the vocabulary projection): {narrow_s:.2f} s, {narrow_s / wide_s:.0%} of it.",
        "",
        *table("beam search", decode_shares),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, "\n".join(lines))  # atomic: a stop never leaves half a report
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
