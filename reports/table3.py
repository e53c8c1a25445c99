"""Table 3 mirrored: our runs row by row beside the paper's, with both changes against base and whether they agree.

Every number comes from the runs on disk (reports.inputs) or from model.table3 (the paper's values); nothing here
is typed in. Several seeds give a mean and a spread (sample standard deviation). The spread of a change is
sqrt(sd_row^2 + sd_base^2), the spread of the difference of one draw of each; a change smaller than its spread is
"n.s." (not significant) instead of agreeing or disagreeing, and so is a change of exactly zero. With one seed per
row there is no spread and the direction is compared as measured (the header says how many seeds each row had).
Where the paper's own change is zero, any change of ours that is significant counts as disagreeing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from model.table3 import Table3Row, table3_rows

PAPER_CONFIG = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls")  # the paper's configuration columns
CONFIG = (*PAPER_CONFIG, "pe")  # pe is row E's change, printed by the paper as text across the columns
METRICS = ("ppl", "bleu", "params")
OURS_COLUMN = {"ppl": "dev_ppl", "bleu": "bleu", "params": "params"}  # column of the results table
AGREE, DISAGREE, NOT_SIGNIFICANT, NOT_COMPARABLE = "yes", "no", "n.s.", "—"


def direction_agreement(ours: float, spread: float, paper: float) -> str:
    """Whether our change points the paper's way: yes/no, n.s. when zero or smaller than its spread, — when a value is missing."""
    if math.isnan(ours) or math.isnan(paper):
        return NOT_COMPARABLE
    if ours == 0 or abs(ours) < spread:  # no change has no direction; NaN spread (one seed) compares as False
        return NOT_SIGNIFICANT
    return AGREE if np.sign(ours) == np.sign(paper) else DISAGREE


def change_spread(sd_row: float, sd_base: float) -> float:
    """Spread of (row - base): sqrt(sd_row^2 + sd_base^2) over the spreads known; NaN when neither is (one seed each)."""
    known = [sd for sd in (sd_row, sd_base) if not math.isnan(sd)]
    return math.sqrt(sum(sd * sd for sd in known)) if known else math.nan


def per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """Finished runs with our metrics under the table's names (row, seed, ppl, bleu, params in millions)."""
    finished = runs[runs["status"] == "finished"] if "status" in runs else runs
    return pd.DataFrame({"row": finished["row"], "seed": finished["seed"], "ppl": finished["dev_ppl"],
                         "bleu": finished["bleu"], "params": finished["params"] / 1e6})


def _ours(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, spread (sample sd) and seed count per row over finished runs; the count of runs that did not finish."""
    grouped = per_run(runs).groupby("row")[list(METRICS)]
    stats = grouped.mean().join(grouped.std(ddof=1).add_suffix("_sd"))
    stats["seeds"] = grouped.size()
    stats["not_finished"] = runs.groupby("row").size().sub(stats["seeds"], fill_value=0)
    return stats


def _config(row: Table3Row, runs: pd.DataFrame, base: dict[str, object]) -> dict[str, object]:
    """The configuration a row ran with: our runs' fields (a budget may scale them); a row not run shows the paper's
    changes on top of our base configuration."""
    mine = runs[runs["row"] == row.name]
    if len(mine) and all(c in mine for c in CONFIG):
        config = {c: mine.iloc[0][c] for c in CONFIG}
    else:
        config = {**base, **row.changes}
    steps = mine["steps"].dropna() if "steps" in mine else pd.Series(dtype=float)
    tokens = mine["tokens_seen"].dropna() if "tokens_seen" in mine else pd.Series(dtype=float)
    config["steps"] = int(steps.median()) if len(steps) else math.nan
    config["tokens_seen"] = int(tokens.median()) if len(tokens) else math.nan
    return config


def compare(runs: pd.DataFrame, rows: list[Table3Row] | None = None) -> pd.DataFrame:
    """One line per Table 3 row, in the paper's order: our config, our mean/sd/seeds per metric, the paper's value,
    our change and the paper's change against the base row, the spread of our change, and whether they agree."""
    rows = rows or table3_rows()
    ours = _ours(runs).reindex([r.name for r in rows])
    base_row = next(r for r in rows if r.name == "base")
    paper_base = {c: getattr(base_row.config(), c) for c in CONFIG}
    base_config = {c: v for c, v in _config(base_row, runs, paper_base).items() if c in CONFIG}
    table = pd.DataFrame([{"row": r.name, "group": r.group, **_config(r, runs, base_config),
                           "paper_steps": r.train_steps, "ppl_paper": r.paper_ppl, "bleu_paper": r.paper_bleu,
                           "params_paper": math.nan if r.paper_params_millions is None else r.paper_params_millions}
                          for r in rows]).set_index("row")
    table = table.join(ours)
    table["seeds"] = table["seeds"].fillna(0).astype(int)
    table["not_finished"] = table["not_finished"].fillna(0).astype(int)
    base = table.loc["base"]
    for m in METRICS:
        table[f"{m}_delta"] = table[m] - base[m]
        table[f"{m}_spread"] = [change_spread(sd, base[f"{m}_sd"]) for sd in table[f"{m}_sd"]]
        table[f"{m}_paper_delta"] = table[f"{m}_paper"] - base[f"{m}_paper"]
        table[f"{m}_agree"] = [direction_agreement(d, s, p) for d, s, p in
                               zip(table[f"{m}_delta"], table[f"{m}_spread"], table[f"{m}_paper_delta"])]
        table.loc["base", f"{m}_agree"] = NOT_COMPARABLE  # base is the reference, not a change
    return table


@dataclass(frozen=True)
class Summary:
    """Rows whose direction agrees with the paper, per metric, and the rank correlation of PPL across rows."""

    agree: dict[str, int]
    compared: dict[str, int]  # rows with a significant change to compare (agree + disagree)
    not_significant: dict[str, int]
    spearman_ppl: float
    spearman_rows: int

    def line(self) -> str:
        parts = [f"{label} {self.agree[m]} of {self.compared[m]} rows (n.s.: {self.not_significant[m]})"
                 for m, label in (("ppl", "PPL"), ("bleu", "BLEU"))]
        rho = "n/a (fewer than 3 rows)" if math.isnan(self.spearman_ppl) else f"{self.spearman_ppl:.2f}"
        return (f"Directions agree with the paper: {'; '.join(parts)}. "
                f"Spearman rank correlation of dev PPL, ours vs paper, over {self.spearman_rows} rows: {rho}.")


def summarize(table: pd.DataFrame) -> Summary:
    """Count agreeing, disagreeing and non-significant rows; Spearman's rho of our PPL against the paper's."""
    counts = {m: table[f"{m}_agree"].value_counts() for m in ("ppl", "bleu")}
    both = table[["ppl", "ppl_paper"]].dropna()
    rho = both.corr(method="spearman").loc["ppl", "ppl_paper"] if len(both) >= 3 else math.nan
    return Summary(
        agree={m: int(c.get(AGREE, 0)) for m, c in counts.items()},
        compared={m: int(c.get(AGREE, 0) + c.get(DISAGREE, 0)) for m, c in counts.items()},
        not_significant={m: int(c.get(NOT_SIGNIFICANT, 0)) for m, c in counts.items()},
        spearman_ppl=float(rho), spearman_rows=len(both),
    )
