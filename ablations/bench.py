"""`nox -s bench`: training-step throughput and beam-search speed of the base model, measured side by side.

Every variant trains on the same newstest2013 batches (the `news` preset's BPE, the paper's 37000-token
vocabulary in the model): the reference model on torch's fused attention, the reference on the explicit
attention path, and the torch.nn.Transformer adapter. bf16 autocast and torch.compile on a GPU, fp32 on CPU.
Writes reports/bench.md and reports/bench.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from ablations.batching import Batch, BatchStream
from ablations.budgets import budget
from ablations.data import data_dir
from ablations.decoding import translate
from ablations.grid import REPO_ROOT, describe_device, git_commit, peak_flops, prepare_data
from ablations.train import make_optimizer, train_step
from model import Parts, Transformer, TransformerConfig, count_parameters, load_model
from model.attention import explicit_attention
from model.config import parse_overrides
from model.objective import learning_rate
from model.params import training_flops

PAPER_STEPS, PAPER_BATCH_TOKENS = 100_000, 25_000  # the base run: 100K steps of ~25000 target tokens


def explicit_attend(q, k, v, allowed, need_weights):
    """The reference attention forced onto the explicit (probability-returning) path."""
    return explicit_attention(q, k, v, allowed)


VARIANTS: dict[str, Callable[[TransformerConfig], torch.nn.Module]] = {
    "reference (fused SDPA)": Transformer,
    "reference (explicit attention)": lambda cfg: Transformer(cfg, Parts(attend=explicit_attend)),
    "torch.nn.Transformer adapter": lambda cfg: load_model(",".join(["torch-nn", *(f"{k}={v}" for k, v in cfg.to_dict().items())])),
}


@dataclass
class TrainResult:
    variant: str
    step_s: float  # median seconds per optimizer step
    tgt_tokens_per_s: float
    tokens_per_s: float  # source + target
    mfu: float | None
    paper_run_hours: float  # 100K steps of 25K target tokens at this rate


def bench_training(name: str, cfg: TransformerConfig, batches: list[Batch], device: torch.device, warmup: int) -> TrainResult:
    torch.manual_seed(0)
    model = VARIANTS[name](cfg).to(device).train()
    forward = torch.compile(model) if device.type == "cuda" else model
    autocast = torch.bfloat16 if device.type == "cuda" else None
    optimizer = make_optimizer(model, device)
    counts = count_parameters(model.parameter_groups())
    times, flops = [], []
    for i, batch in enumerate(tqdm(batches, desc=name, unit="step", leave=False)):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        train_step(forward, model.loss, optimizer, [batch], learning_rate(i + 1, cfg.d_model), autocast)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:  # the first steps compile kernels and warm caches
            times.append(time.perf_counter() - start)
            flops.append(training_flops(cfg, counts, batch.src_tokens, batch.tgt_tokens))
    timed = batches[warmup:]
    total_s = sum(times)
    tgt = sum(b.tgt_tokens for b in timed) / total_s
    peak = peak_flops(device)
    return TrainResult(name, statistics.median(times), tgt, sum(b.src_tokens + b.tgt_tokens for b in timed) / total_s,
                       sum(flops) / total_s / peak if peak else None, PAPER_STEPS * PAPER_BATCH_TOKENS / tgt / 3600)


def bench_decoding(name: str, cfg: TransformerConfig, src: list[list[int]], device: torch.device) -> dict:
    """Beam 4, alpha 0.6; untrained weights rarely emit EOS, so hypotheses run to source length + 50 (a worst case)."""
    torch.manual_seed(0)
    model = VARIANTS[name](cfg).to(device).eval()
    autocast = torch.bfloat16 if device.type == "cuda" else None
    start = time.perf_counter()
    hyps = translate(model, src, device, autocast=autocast)
    elapsed = time.perf_counter() - start
    return {"variant": name, "sentences": len(src), "sentences_per_s": len(src) / elapsed,
            "output_tokens_per_s": sum(map(len, hyps)) / elapsed}


def markdown(meta: dict, training: list[TrainResult], decoding: list[dict]) -> str:
    ref = training[0]
    lines = [
        "# Benchmark: training step and beam search, base model",
        "",
        f"Measured by `nox -s bench{' -- ' + meta['args'] if meta['args'] else ''}` on {meta['device']}, torch {meta['torch']}, commit "
        f"{meta['commit']}, {meta['date']}. Config {meta['config']}, "
        f"{meta['precision']}; {meta['steps']} timed steps after {meta['warmup']} warm-up steps on the same "
        f"{meta['preset']} dev batches of about {meta['batch_tokens']} source and target positions.",
        "",
        "| variant | s/step (median) | target tok/s | src+tgt tok/s | MFU | vs reference | paper base run (100K x 25K tok) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in training:
        mfu = f"{r.mfu:.1%}" if r.mfu is not None else "n/a (CPU)"
        lines.append(f"| {r.variant} | {r.step_s:.3f} | {r.tgt_tokens_per_s:,.0f} | {r.tokens_per_s:,.0f} | {mfu} | "
                     f"{r.tgt_tokens_per_s / ref.tgt_tokens_per_s:.2f}x | {r.paper_run_hours:,.1f} h |")
    lines += ["", "The paper: 12 hours for the base run on 8 P100 GPUs. MFU counts 6 FLOPs per weight per token "
              "(attention scores left out) against the GPU's dense bf16 peak.", "",
              "## Beam search (beam 4, alpha 0.6, batched)", "",
              f"First {meta['decode_sentences']} sentences of the {meta['preset']} dev set, untrained weights: hypotheses rarely end "
              "early, so outputs run to source length + 50 and these rates are a lower bound for a trained model.", "",
              "| variant | sentences/s | output tok/s |", "|---|---|---|"]
    for d in decoding:
        lines.append(f"| {d['variant']} | {d['sentences_per_s']:.2f} | {d['output_tokens_per_s']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    parser.add_argument("--preset", default="news", help="data preset whose BPE and dev set give the batches (default news: newstest2013)")
    parser.add_argument("--runs", default=str(REPO_ROOT / "runs"), help="where the BPE cache lives")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20 on GPU, 3 on CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 5 on GPU, 1 on CPU)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="positions per side per step (default 25000 GPU, 2000 CPU)")
    parser.add_argument("--decode-sentences", type=int, default=None, help="sentences to beam-search (default 500 GPU, 8 CPU)")
    parser.add_argument("--config", default="", help="overrides of the base config, e.g. N=2,d_model=256 (default: base)")
    parser.add_argument("--out", default=str(REPO_ROOT / "reports" / "bench.md"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    steps = args.steps or (20 if gpu else 3)
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    batch_tokens = args.batch_tokens or (25000 if gpu else 2000)
    n_decode = args.decode_sentences or (500 if gpu else 8)
    try:
        pairs = dict(item.split("=", 1) for item in args.config.split(",") if item)
        cfg = TransformerConfig().replace(**parse_overrides(pairs))  # base, with the paper's 37000-token vocabulary
        data = prepare_data(budget("short"), args.preset, data_dir(args.data), Path(args.runs))
    except ValueError as exc:  # DataError, or a bad --config
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stream = BatchStream(data.dev_src, data.dev_tgt, batch_tokens, seed=0)
    batches = [stream.next().to(device) for _ in range(warmup + steps)]
    training = [bench_training(name, cfg, batches, device, warmup) for name in VARIANTS]
    decoding = [bench_decoding(name, cfg, data.dev_src[:n_decode], device) for name in ("reference (fused SDPA)", "torch.nn.Transformer adapter")]
    meta = {"device": describe_device(device), "torch": torch.__version__, "commit": git_commit(),
            "date": datetime.date.today().isoformat(), "precision": "bf16 autocast, torch.compile" if gpu else "fp32",
            "config": "base (N=6, d_model=512, 37000-token vocabulary)" + (f" with {args.config}" if args.config else ""),
            "preset": args.preset, "steps": steps, "warmup": warmup, "batch_tokens": batch_tokens, "decode_sentences": n_decode,
            "args": " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(meta, training, decoding))
    out.with_suffix(".json").write_text(json.dumps({**meta, "training": [r.__dict__ for r in training], "decoding": decoding}, indent=2) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
