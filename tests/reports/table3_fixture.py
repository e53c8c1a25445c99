"""A small fixed set of Table 3 results written in the runner's format, chosen so that every verdict occurs: A1 agrees
with the paper, A3's PPL changes by less than two standard errors (n.s.), C7's PPL goes the other way (disagrees), E1
(the paper: no change in PPL) changes PPL significantly (disagrees), A3's BLEU (the paper: no change) stays within its
errors (agrees), D1 has one diverged seed of three (2 seeds: no verdict), big has one seed (no verdict), and the other
rows were not run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from model.table3 import paper_architecture_params, table3_rows

PAPER = {r.name: r for r in table3_rows()}
# (dev PPL, BLEU) per seed; None is a diverged run.
FIXTURE = {
    "base": [(10.0, 20.0), (10.2, 20.4), (10.4, 20.8)],
    "A1": [(11.0, 18.0), (11.2, 18.4), (11.4, 18.8)],
    "A3": [(10.1, 20.1), (10.3, 20.5), (10.5, 20.9)],
    "C7": [(11.4, 21.0), (11.6, 21.4), (11.8, 21.8)],
    "D1": [None, (12.0, 15.0), (12.2, 15.4)],
    "E1": [(10.8, 20.0), (11.0, 20.4), (11.2, 20.8)],
    "big": [(9.0, 22.0)],
}
SE = math.sqrt(0.04 / 3 + 0.04 / 3)  # standard error of a change between two rows of 3 seeds with sd 0.2 each
SMOKE_VOCAB = 1000
STEPS = 40


def write_run(
    root: Path,
    row: str,
    seed: int,
    result: tuple[float, float] | None,
    budget: str = "smoke",
    date: str = "2026-11-22T10:{seed:02d}:00Z",
    config_hash: str = "{seed:08x}",
) -> Path:
    """One run folder in the results format: config.json, metrics.jsonl and final.json."""
    config = PAPER[row].config().replace(vocab_size=SMOKE_VOCAB)
    steps = STEPS * 3 if row == "big" else STEPS
    run = root / budget / "runs" / f"{row}-s{seed}-{config_hash.format(seed=seed)}"
    run.mkdir(parents=True)
    common = {
        "row": row,
        "group": PAPER[row].group,
        "seed": seed,
        "budget": budget,
        "preset": "tiny",
        "scaled": budget == "smoke",
        "model_spec": "reference",
    }
    (run / "config.json").write_text(
        json.dumps(
            common
            | {
                "config": config.to_dict(),
                "train": {"steps": steps, "warmup": 10, "batch_tokens": 512},
                "data": {"max_train_pairs": 4000, "dev_pairs": 100},
            }
        )
    )
    ppl, bleu = (math.nan, math.nan) if result is None else result
    lines = [
        {"step": s, "loss": 5.0 - s / steps, "lr": 1e-3, "tokens_per_s": 1000.0 + seed, "time_s": s / 10}
        | ({"dev_ppl": ppl * (1 + (steps - s) / steps)} if s % 20 == 0 else {})
        for s in range(1, steps + 1)
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in lines) + "\n")
    final = common | {
        "status": "diverged" if result is None else "finished",
        "error": "loss is NaN" if result is None else None,
        "dev_ppl": None if result is None else ppl,
        "bleu": None if result is None else bleu,
        "bleu_tokenized": None if result is None else bleu + 0.5,
        "sacrebleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "params": paper_architecture_params(config),
        "steps": steps,
        "tokens_seen": steps * 512,
        "wall_s": steps / 10,
        "tokens_per_s": 1000.0 + seed,
        "gemm_fraction": 0.25 + seed / 100,
        "mfu": None,
        "device": "cpu",
        "torch": "2.13.0",
        "commit": "abc1234",
        "date": date.format(seed=seed),
        "config": config.to_dict(),
    }
    (run / "final.json").write_text(json.dumps(final))
    return run


def write_fixture(root: Path, budget: str = "smoke") -> Path:
    for row, results in FIXTURE.items():
        for seed, result in enumerate(results):
            write_run(root, row, seed, result, budget)
    return root / budget
