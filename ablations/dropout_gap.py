"""`python -m ablations.dropout_gap RUN_DIR...`: a run's dev perplexity with dropout off, as runs are scored, and on.

A post-LN model that has not left the unigram plateau can come to depend on dropout's noise: trained with it, its
training loss stays at the plateau, while in eval mode (dropout off) its predictions collapse and the dev PPL climbs
far above the vocabulary size. Scoring the same weights both ways tells that apart from a divergence of training,
where both are high. Reads each run's weights (model.pt, else checkpoint.pt) and the BPE from the runs folder's cache.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ablations.attention_data import NoAttentionData, load_trained
from ablations.budgets import budget
from ablations.data import data_dir
from ablations.evaluate import perplexity
from ablations.grid import prepare_data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.dropout_gap", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (<runs>/<budget>/<row>-s<seed>-<hash>)")
    parser.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    parser.add_argument("--pairs", type=int, default=300, help="leading dev pairs scored (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dropout masks (default 0)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        print(f"error: --pairs {args.pairs}: give a whole number of at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    prepared = {}  # (budget, preset) -> its BPE and encoded dev set, shared by that budget's runs
    print("| run | dev PPL, dropout off (as scored) | dev PPL, dropout on |\n|---|---|---|")
    for run in args.runs:
        try:
            if not (run / "config.json").is_file():
                raise ValueError(f"{run}: no config.json; pass a run folder, e.g. runs/cpu/base-s1-<hash>")
            config = json.loads((run / "config.json").read_text())
            runs_root = run.resolve().parent.parent
            trained = load_trained(run, [runs_root / "cache"])
            key = (config["budget"], config["preset"], runs_root)
            if key not in prepared:
                prepared[key] = prepare_data(budget(config["budget"]), config["preset"], data_dir(args.data), runs_root)
            data = prepared[key]
        except (ValueError, NoAttentionData) as exc:  # DataError, a missing BPE or weights
            print(f"error: {exc}", file=sys.stderr)
            return 2
        src, tgt, device = data.dev_src[: args.pairs], data.dev_tgt[: args.pairs], torch.device("cpu")
        off = perplexity(trained.model, src, tgt, device)
        torch.manual_seed(args.seed)
        on = perplexity(trained.model, src, tgt, device, dropout=True)
        print(f"| {trained.label} | {off:,.1f} | {on:,.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
