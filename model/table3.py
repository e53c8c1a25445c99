"""The paper's Table 3 as data: each row is a set of config changes from base plus the paper's printed results.

table3.csv beside this file holds the facts of the paper's table (a blank cell means "same as base").
Rows are named by group and position: base, A1..A4, B1..B2, C1..C7, D1..D4, E1, big.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from model.config import TransformerConfig, parse_overrides

TABLE3_CSV = Path(__file__).with_name("table3.csv")
CONFIG_COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "pe")


@dataclass(frozen=True)
class Table3Row:
    name: str
    group: str  # base, A, B, C, D, E, big
    changes: dict[str, object] = field(hash=False)  # config fields that differ from base
    train_steps: int
    paper_ppl: float
    paper_bleu: float
    paper_params_millions: float | None  # blank in the paper for rows A, D, E

    def config(self, base: TransformerConfig = TransformerConfig()) -> TransformerConfig:
        return base.replace(**self.changes)


def table3_rows() -> list[Table3Row]:
    """The 20 rows of Table 3 in the paper's order."""
    with TABLE3_CSV.open(newline="") as f:
        records = list(csv.DictReader(f))
    base = TransformerConfig()
    rows, counts = [], {}
    for rec in records:
        group = rec["group"]
        counts[group] = counts.get(group, 0) + 1
        name = group if group in ("base", "big") else f"{group}{counts[group]}"
        changes = parse_overrides({c: rec[c] for c in CONFIG_COLUMNS if rec[c].strip()})
        changes = {c: v for c, v in changes.items() if getattr(base, c) != v}
        params = rec["params_millions"].strip()
        rows.append(
            Table3Row(
                name,
                group,
                changes,
                int(rec["train_steps"] or records[0]["train_steps"]),
                float(rec["ppl_dev"]),
                float(rec["bleu_dev"]),
                float(params) if params else None,
            )
        )
    return rows


def paper_architecture_params(cfg: TransformerConfig) -> int:
    """The paper's architecture counted by hand: post-LN layers with biases, one shared embedding, no final norms."""
    d, inner_k, inner_v = cfg.d_model, cfg.h * cfg.d_k, cfg.h * cfg.d_v
    attention = 2 * (d * inner_k + inner_k) + (d * inner_v + inner_v) + (inner_v * d + d)
    ffn = d * cfg.d_ff + cfg.d_ff + cfg.d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    learned_pe = cfg.max_len * d if cfg.pe == "learned" else 0
    return cfg.N * (encoder_layer + decoder_layer) + cfg.vocab_size * d + learned_pe


def implied_vocab_size() -> int:
    """The shared vocabulary that makes the paper's params column fit its architecture best (least squares, relative).

    The paper says "about 37000" tokens; its printed counts sit about 2M above what 37000 gives at d_model=512.
    """
    num = den = 0.0
    for row in table3_rows():
        if row.paper_params_millions is None:
            continue
        cfg = row.config().replace(vocab_size=1)
        paper = row.paper_params_millions * 1e6
        rest = paper_architecture_params(cfg) - cfg.d_model
        num += cfg.d_model * (paper - rest) / paper**2
        den += cfg.d_model**2 / paper**2
    return round(num / den)


# The paper's two models, "base" and "big", are rows of Table 3: their configs are read from it, not restated.
PRESETS: dict[str, TransformerConfig] = {row.name: row.config() for row in table3_rows() if row.name in ("base", "big")}


def preset(name: str) -> TransformerConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]
