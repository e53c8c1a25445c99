"""Table 3 mirrored: our runs row by row beside the paper's, with both changes against base and whether they agree.

Every number comes from the runs on disk (reports.inputs) or from model.table3 (the paper's values); nothing here
is typed in. Several seeds give a mean and a spread (sample standard deviation). SIGNIFICANCE below is the rule by
which a change of ours counts, stated in every report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from model.table3 import CONFIG_COLUMNS, Table3Row, table3_rows

# The paper's configuration columns; pe is row E's change, printed by the paper as text across the columns.
PAPER_CONFIG = tuple(c for c in CONFIG_COLUMNS if c != "pe")
METRICS = ("ppl", "bleu", "params")
AGREE, DISAGREE, NOT_SIGNIFICANT, NOT_COMPARABLE = "yes", "no", "n.s.", "—"
MIN_SEEDS = 3  # fewer finished seeds on either side of a change: no verdict
SE_MULTIPLE = 2.0  # a change counts beyond this many standard errors of the difference of two means
SIGNIFICANCE = (
    f"A change against base counts only with at least {MIN_SEEDS} seeds of the row and of base, and only when it exceeds "
    f"{SE_MULTIPLE:g} standard errors of the difference of the means, {SE_MULTIPLE:g} × sqrt(sd_row²/n_row + sd_base²/n_base) "
    "(sd: sample standard deviation over seeds, n: seeds): then it agrees (yes) when it points the paper's way, "
    "disagrees (no) otherwise; a smaller change is n.s. Where the paper's own change is zero (no change expected), "
    "a change of ours that does not count agrees and one that counts disagrees. With fewer seeds the verdict says "
    'how many there were ("1 seed"): no yes/no. Parameter counts are exact and compared as counted.'
)


def too_few_seeds(seeds: int) -> str:
    """The verdict of a change measured with fewer than MIN_SEEDS seeds: just how many there were."""
    return f"{seeds} seed" if seeds == 1 else f"{seeds} seeds"


def change_se(sd_row: float, n_row: int, sd_base: float, n_base: int) -> float:
    """Standard error of mean_row - mean_base: sqrt(sd_row²/n_row + sd_base²/n_base); NaN without two seeds a side."""
    if n_row < 2 or n_base < 2:
        return math.nan
    return math.sqrt(sd_row * sd_row / n_row + sd_base * sd_base / n_base)


def verdict(ours: float, se: float, paper: float, seeds: int, exact: bool = False) -> str:
    """Whether our change agrees with the paper's under SIGNIFICANCE; `seeds` is the fewer of the row's and base's,
    `exact` marks a metric without noise (params), compared as counted."""
    if math.isnan(ours) or math.isnan(paper):
        return NOT_COMPARABLE
    if exact:
        significant = ours != 0
    elif seeds < MIN_SEEDS:
        return too_few_seeds(seeds)
    else:
        significant = abs(ours) > SE_MULTIPLE * se
    if paper == 0:  # the paper saw no change: agreeing means seeing none either
        return DISAGREE if significant else AGREE
    if not significant:
        return NOT_SIGNIFICANT
    return AGREE if np.sign(ours) == np.sign(paper) else DISAGREE


def judge(mean: pd.Series, sd: pd.Series, seeds: pd.Series, paper: pd.Series, exact: bool = False) -> pd.DataFrame:
    """Per row (indexed by row name, base among them): our change against base, its standard error, the paper's
    change, and the verdict; base itself gets no verdict."""
    n = seeds.fillna(0).astype(int)
    delta, paper_delta = mean - mean["base"], paper - paper["base"]
    se = pd.Series([change_se(sd[r], n[r], sd["base"], n["base"]) for r in mean.index], index=mean.index)
    verdicts = pd.Series(
        [verdict(delta[r], se[r], paper_delta[r], min(n[r], n["base"]), exact) for r in mean.index], index=mean.index
    )
    verdicts["base"] = NOT_COMPARABLE
    return pd.DataFrame({"delta": delta, "se": se, "paper_delta": paper_delta, "agree": verdicts})


def per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """Finished runs with our metrics under the table's names (row, seed, ppl, bleu, params in millions)."""
    finished = runs[runs["status"] == "finished"] if "status" in runs else runs
    return pd.DataFrame(
        {
            "row": finished["row"],
            "seed": finished["seed"],
            "ppl": finished["dev_ppl"],
            "bleu": finished["bleu"],
            "params": finished["params"] / 1e6,
        }
    )


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
    if len(mine) and all(c in mine for c in CONFIG_COLUMNS):
        config = {c: mine.iloc[0][c] for c in CONFIG_COLUMNS}
    else:
        config = {**base, **row.changes}
    # the row's median over its runs: steps and tokens seen, and the training throughput
    for column, kind in (("steps", int), ("tokens_seen", int), ("tokens_per_s", float), ("gemm_fraction", float)):
        values = mine[column].dropna() if column in mine else pd.Series(dtype=float)
        config[column] = kind(values.median()) if len(values) else math.nan
    return config


def compare(runs: pd.DataFrame, rows: list[Table3Row] | None = None) -> pd.DataFrame:
    """One line per Table 3 row, in the paper's order: our config, our mean/sd/seeds per metric, the paper's value,
    our change and the paper's change against the base row, the standard error of our change, the verdict."""
    rows = rows or table3_rows()
    ours = _ours(runs).reindex([r.name for r in rows])
    base_row = next(r for r in rows if r.name == "base")
    paper_base = {c: getattr(base_row.config(), c) for c in CONFIG_COLUMNS}
    base_config = {c: v for c, v in _config(base_row, runs, paper_base).items() if c in CONFIG_COLUMNS}
    table = pd.DataFrame(
        [
            {
                "row": r.name,
                "group": r.group,
                **_config(r, runs, base_config),
                "paper_steps": r.train_steps,
                "ppl_paper": r.paper_ppl,
                "bleu_paper": r.paper_bleu,
                "params_paper": math.nan if r.paper_params_millions is None else r.paper_params_millions,
            }
            for r in rows
        ]
    ).set_index("row")
    table = table.join(ours)
    table["seeds"] = table["seeds"].fillna(0).astype(int)
    table["not_finished"] = table["not_finished"].fillna(0).astype(int)
    for m in METRICS:
        judged = judge(table[m], table[f"{m}_sd"], table["seeds"], table[f"{m}_paper"], exact=m == "params")
        table[f"{m}_delta"], table[f"{m}_se"] = judged["delta"], judged["se"]
        table[f"{m}_paper_delta"], table[f"{m}_agree"] = judged["paper_delta"], judged["agree"]
    return table


@dataclass(frozen=True)
class Tally:
    """Verdicts over rows: agreeing, judged (yes + no + n.s.), not significant, and without a verdict for want of seeds."""

    agree: int
    judged: int
    not_significant: int
    few_seeds: int

    @property
    def share(self) -> float:
        """The share of judged rows that agree with the paper; NaN when no row could be judged."""
        return self.agree / self.judged if self.judged else math.nan

    def text(self) -> str:
        if not self.judged:
            return (
                f"no verdict ({count_rows(self.few_seeds)} with fewer than {MIN_SEEDS} seeds)"
                if self.few_seeds
                else "no rows"
            )
        few = f", {self.few_seeds} with fewer than {MIN_SEEDS} seeds" if self.few_seeds else ""
        return f"{self.agree} of {self.judged} rows agree ({self.share:.0%}; n.s. {self.not_significant}{few})"


def tally(verdicts: pd.Series) -> Tally:
    """Count the verdicts of the rows (base and rows without a value excluded)."""
    counts = verdicts.value_counts()
    few = sum(n for v, n in counts.items() if v.endswith(("seed", "seeds")))
    agree, disagree, ns = (int(counts.get(v, 0)) for v in (AGREE, DISAGREE, NOT_SIGNIFICANT))
    return Tally(agree, agree + disagree + ns, ns, int(few))


def spearman(ours: pd.Series, paper: pd.Series) -> tuple[float, int]:
    """Spearman's rank correlation of our values with the paper's over the rows having both; NaN under 3 rows."""
    both = pd.DataFrame({"ours": ours, "paper": paper}).dropna()
    rho = both.corr(method="spearman").loc["ours", "paper"] if len(both) >= 3 else math.nan
    return float(rho), len(both)


@dataclass(frozen=True)
class Summary:
    """The verdicts per metric (PPL, BLEU) and the rank correlation of PPL across rows."""

    tallies: dict[str, Tally]
    spearman_ppl: float
    spearman_rows: int

    def line(self) -> str:
        rho = "n/a (fewer than 3 rows)" if math.isnan(self.spearman_ppl) else f"{self.spearman_ppl:.2f}"
        return (
            f"Agreement with the paper's changes (2-SE rule, at least {MIN_SEEDS} seeds): "
            f"PPL {self.tallies['ppl'].text()}; BLEU {self.tallies['bleu'].text()}. "
            f"Spearman rank correlation of dev PPL, ours vs paper, over {self.spearman_rows} rows: {rho}."
        )


def summarize(table: pd.DataFrame) -> Summary:
    """Tally the PPL and BLEU verdicts; Spearman's rho of our PPL against the paper's."""
    rho, rows = spearman(table["ppl"], table["ppl_paper"])
    return Summary({m: tally(table[f"{m}_agree"]) for m in ("ppl", "bleu")}, rho, rows)


def count_rows(n: int) -> str:
    """'1 row', '3 rows'."""
    return f"{n} row{'' if n == 1 else 's'}"


def missing_conclusions(table: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The paper's changes that our runs do not show, as (row, metric, line) per row and metric (ppl, bleu), the line
    saying what was measured: reversed beyond SE_MULTIPLE standard errors (no), or within them (n.s.), where the
    paper's change set beside that resolution says whether these seeds could have shown it at all."""
    lines = []
    for row in table.index:
        for m, label in (("ppl", "dev PPL"), ("bleu", "BLEU")):
            verdict_, ours, se, paper = table.loc[row, [f"{m}_agree", f"{m}_delta", f"{m}_se", f"{m}_paper_delta"]]
            if verdict_ == DISAGREE and paper == 0:
                why = f"a change beyond {SE_MULTIPLE:g} SE where the paper saw none"
            elif verdict_ == DISAGREE:
                why = f"the opposite direction, beyond {SE_MULTIPLE:g} SE"
            elif verdict_ == NOT_SIGNIFICANT and abs(paper) > SE_MULTIPLE * se:
                why = f"within {SE_MULTIPLE:g} SE of none, though a change the size of the paper's would have shown"
            elif verdict_ == NOT_SIGNIFICANT:
                why = (
                    f"within {SE_MULTIPLE:g} SE of none; the paper's change is smaller than {SE_MULTIPLE:g} SE "
                    f"({SE_MULTIPLE * se:.2f}), so these seeds could not have shown it"
                )
            else:
                continue
            lines.append((row, m, f"{row}: {label} {ours:+.2f} (SE {se:.2f}) against the paper's {paper:+.2f}: {why}"))
    return lines
