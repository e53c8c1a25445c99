"""`python -m ablations.dropout_gap RUN_DIR...`: a run's dev perplexity with dropout off, as runs are scored, and on.

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

from ablations import runs as R
from ablations.bpe import encode
from ablations.budgets import budget
from ablations.data import data_dir, preset_named, read_pairs
from ablations.evaluate import perplexity
from ablations.options import check_counts, failed
from ablations.stopping import stops_cleanly
from ablations.trained import load_trained


@stops_cleanly("the rows above are the runs scored before the stop")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.dropout_gap", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (<runs>/<budget>/<row>-s<seed>-<hash>)")
    parser.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    parser.add_argument(
        "--pairs", type=int, default=300, help="leading dev pairs scored (default 300; at most the budget's dev set)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the dropout masks (default 0)")
    args = parser.parse_args(argv)
    try:
        check_counts(("--pairs", args.pairs))
    except ValueError as exc:
        return failed(exc)
    torch.set_num_threads(1)
    dev_sets = {}  # preset -> its dev pairs, read once for every run trained on it
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
            recorded = config["data"]  # the run was scored on this many leading dev pairs (None: all of them)
            dev_pairs = recorded["dev_pairs"] if "dev_pairs" in recorded else budget(config["budget"]).dev_pairs
        except ValueError as exc:  # DataError, an unknown budget, NoTrainedModel (a missing BPE or weights)
            return failed(exc)
        pairs = dev_sets[preset].head(min(args.pairs, dev_pairs or args.pairs))
        (src, tgt), device = encode(trained.sp, pairs), torch.device("cpu")
        off = perplexity(trained.model, src, tgt, device)
        torch.manual_seed(args.seed)
        on = perplexity(trained.model, src, tgt, device, dropout=True)
        print(f"| {trained.label} | {off:,.1f} | {on:,.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
