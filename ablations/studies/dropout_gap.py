"""`python -m ablations.studies.dropout_gap RUN_DIR...`: a run's dev perplexity with dropout off, as runs are scored, and on;
with --layers, where between the two modes the model's representations part, residual sublayer by sublayer.

A post-LN model that has not left the unigram plateau can come to depend on dropout's noise: trained with it, its
training loss stays at the plateau, while in eval mode (dropout off) its predictions collapse and the dev PPL climbs
far above the vocabulary size. Scoring the same weights both ways tells that apart from a divergence of training,
where both are high. Reads each run's weights (model.pt, else checkpoint.pt), its BPE from the runs folder's cache,
and its preset's dev set (only that: the training set is not read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from ablations.data.batching import make_batch
from ablations.data.bpe import encode
from ablations.data.corpora import data_dir, preset_named, read_pairs
from ablations.runs import folder as R
from ablations.runs.budgets import as_recorded, budget
from ablations.runs.options import failed
from ablations.scoring.evaluate import perplexity
from ablations.training.trained import load_trained
from model.layers import Residual
from model.protocol import Seq2SeqModel
from plumbing.cli import check_counts
from plumbing.stopping import stops_cleanly

LAYER_PAIRS = 100  # sentences for --layers, one at a time (no padding to mask out of the statistics)


@stops_cleanly("the rows above are the runs scored before the stop")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.studies.dropout_gap", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (<runs>/<budget>/<row>-s<seed>-<hash>)")
    parser.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    parser.add_argument(
        "--pairs", type=int, default=300, help="leading dev pairs scored (default 300; at most the budget's dev set)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the dropout masks (default 0)")
    parser.add_argument(
        "--layers", action="store_true", help=f"and each residual sublayer in both modes ({LAYER_PAIRS} pairs)"
    )
    args = parser.parse_args(argv)
    try:
        check_counts(("--pairs", args.pairs))
    except ValueError as exc:
        return failed(exc)
    torch.set_num_threads(1)
    dev_sets = {}  # preset -> its dev pairs, read once for every run trained on it
    layers = []  # with --layers: each run's sublayer table
    print("| run | dev PPL, dropout off (as scored) | dev PPL, dropout on |\n|---|---|---|")
    for run in args.runs:
        try:
            trained = load_trained(R.recorded(run), [run.resolve().parent.parent / "cache"])
            config = trained.config
            if "budget" not in config or "preset" not in config:
                raise ValueError(f"{run / R.CONFIG} names no budget or preset: not a {R.CONFIG} the runner wrote")
            preset = config["preset"]
            if preset not in dev_sets:
                dev_sets[preset] = read_pairs(data_dir(args.data), preset_named(preset).dev, preset)
            dev_pairs = as_recorded(budget(config["budget"]), config)[0].dev_pairs  # the run's (None: all of them)
        except ValueError as exc:  # DataError, an unknown budget, NoTrainedModel (a missing BPE or weights)
            return failed(exc)
        pairs = dev_sets[preset].head(min(args.pairs, dev_pairs or args.pairs))
        (src, tgt), device = encode(trained.sp, pairs), torch.device("cpu")
        off = perplexity(trained.model, src, tgt, device)
        torch.manual_seed(args.seed)
        on = perplexity(trained.model, src, tgt, device, dropout=True)
        print(f"| {trained.label} | {off:,.1f} | {on:,.1f} |", flush=True)
        if args.layers:  # printed after the perplexities, so that their table stays one table
            torch.manual_seed(args.seed)
            try:
                layers.append(f"{trained.label}:\n\n{layer_table(trained.model, src[:LAYER_PAIRS], tgt[:LAYER_PAIRS])}")
            except ValueError as exc:  # a model without the reference's residual sublayers
                return failed(exc)
    for table in layers:
        print(f"\n{table}")
    return 0


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean(-1).sqrt()


def _pass(
    model: Seq2SeqModel,
    residuals: list[tuple[str, Residual]],
    src: list[list[int]],
    tgt: list[list[int]],
    dropout: bool,
) -> tuple[dict, float]:
    """One pass over the pairs in one mode: each Residual's inputs and output per sentence, and the mean entropy of
    the predicted distributions (nats)."""
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def recorder(name: str):
        return lambda module, args, output: seen.setdefault(name, []).append((args[0], args[1], output))

    handles = [m.register_forward_hook(recorder(name)) for name, m in residuals]
    entropies = []
    try:
        model.train(dropout)
        with torch.no_grad():
            for s, t in zip(src, tgt):
                log_p = make_batch([s], [t]).forward(model).log_softmax(-1)
                entropies.append(-(log_p.exp() * log_p).sum(-1).mean().item())
    finally:
        for handle in handles:
            handle.remove()
        model.eval()
    return seen, sum(entropies) / len(entropies)


def layer_table(model: Seq2SeqModel, src: list[list[int]], tgt: list[list[int]]) -> str:
    """Markdown: per residual sublayer LayerNorm(x + Dropout(Sublayer(x))), in execution order, the update's size
    against its input (rms ratio) with dropout off and on, and the cosine between the two modes' outputs on the same
    sentences; then the predicted distribution's entropy. Where the cosine falls is where eval mode leaves the
    representations that training (dropout on) shaped."""
    residuals = [(name, m) for name, m in model.named_modules() if isinstance(m, Residual)]
    if not residuals:
        raise ValueError(
            "--layers reads the reference model's residual sublayers (model/layers.py); this model has none"
        )
    off, entropy_off = _pass(model, residuals, src, tgt, dropout=False)
    on, entropy_on = _pass(model, residuals, src, tgt, dropout=True)
    lines = [
        "| sublayer | update / input rms, dropout off | dropout on | cosine of the outputs, off vs on |",
        "|---|---|---|---|",
    ]
    for name, records in off.items():
        ratio = [torch.cat([(_rms(u) / _rms(x)).flatten() for x, u, _ in r]).mean().item() for r in (records, on[name])]
        cosine = torch.cat([F.cosine_similarity(a[2], b[2], dim=-1).flatten() for a, b in zip(records, on[name])])
        lines.append(f"| {name} | {ratio[0]:.2f} | {ratio[1]:.2f} | {cosine.mean().item():.3f} |")
    lines.append(f"| predicted distribution: entropy (nats) | {entropy_off:.2f} | {entropy_on:.2f} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
