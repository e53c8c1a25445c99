"""When do the paper's conclusions appear? Table 3's verdicts at every evaluation step of training.

From each run's dev-PPL curve (metrics.jsonl), at every step where base has a dev PPL: the share of rows whose change
against base at that step agrees with the paper's under table3.SIGNIFICANCE, and Spearman's rank correlation of our
PPL with the paper's across rows; for all rows and per group A-E (a group's correlation includes base, the row it
is measured from). A row counts at a step with the seeds that logged it there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from model.table3 import Table3Row, table3_rows
from plumbing.files import write_atomic
from reports.table3 import MIN_SEEDS, judge, spearman, tally

GROUPS = ("A", "B", "C", "D", "E")
SCOPES = ("all", *GROUPS)  # "all": every row of Table 3 against base, big included
COLUMNS = [
    "step",
    "scope",
    "rows",
    "agree",
    "judged",
    "not_significant",
    "few_seeds",
    "share",
    "spearman",
    "spearman_rows",
    "min_seeds",
    "max_seeds",
]


def _at_step(points: pd.DataFrame, rows: list[Table3Row]) -> pd.DataFrame:
    """Mean, sample sd and seeds of dev PPL per row at one step, with the verdict of its change against base."""
    grouped = points.groupby("row")["dev_ppl"]
    stats = pd.DataFrame({"mean": grouped.mean(), "sd": grouped.std(ddof=1), "seeds": grouped.size()})
    stats = stats.reindex([r.name for r in rows])
    paper = pd.Series({r.name: r.paper_ppl for r in rows})
    judged = judge(stats["mean"], stats["sd"], stats["seeds"], paper)
    group = pd.Series({r.name: r.group for r in rows})
    return stats.join(judged).assign(paper=paper, group=group)


def _evaluated_steps(curves: pd.DataFrame, rows: list[Table3Row]) -> Iterator[tuple[int, pd.DataFrame]]:
    """(step, each row's dev-PPL statistics and verdict there) for every step where base was evaluated: without
    base there is no change to measure."""
    for step, points in curves.dropna(subset=["dev_ppl"]).groupby("step", sort=True):
        if "base" in set(points["row"]):
            yield int(step), _at_step(points, rows)


def by_step(curves: pd.DataFrame, rows: list[Table3Row] | None = None) -> pd.DataFrame:
    """One line per (evaluation step, scope): the tally of verdicts, the agreement share and Spearman's rho there.

    `curves` holds one line per logged step of each run (row, seed, step, dev_ppl), as reports.inputs reads them.
    """
    lines = []
    for step, stats in _evaluated_steps(curves, rows or table3_rows()):
        for scope in SCOPES:
            members = stats if scope == "all" else stats[stats["group"].isin([scope, "base"])]
            changed = members.drop(index="base")
            ran = changed.dropna(subset=["mean"])
            counts = tally(changed["agree"])
            rho, rho_rows = spearman(members["mean"], members["paper"])
            lines.append(
                {
                    "step": int(step),
                    "scope": scope,
                    "rows": len(ran),
                    "agree": counts.agree,
                    "judged": counts.judged,
                    "not_significant": counts.not_significant,
                    "few_seeds": counts.few_seeds,
                    "share": counts.share,
                    "spearman": rho,
                    "spearman_rows": rho_rows,
                    "min_seeds": int(members["seeds"].min()) if len(ran) else 0,
                    "max_seeds": int(members["seeds"].max()) if len(ran) else 0,
                }
            )
    return pd.DataFrame(lines, columns=COLUMNS)


def changes_by_step(curves: pd.DataFrame, rows: list[Table3Row] | None = None) -> pd.DataFrame:
    """Each row's change in mean dev PPL against base's at every step where base was evaluated, with its verdict
    there: columns step, row, change, agree (a row's trend, to tell a conclusion still forming from one that is not)."""
    lines = []
    for step, stats in _evaluated_steps(curves, rows or table3_rows()):
        ran = stats.dropna(subset=["mean"])
        change = ran["mean"] - ran.loc["base", "mean"]
        lines += [{"step": step, "row": r, "change": change[r], "agree": ran.loc[r, "agree"]} for r in change.index]
    return pd.DataFrame(lines, columns=["step", "row", "change", "agree"])


def _cell(line: pd.Series) -> str:
    """One scope at one step, compactly: 'agree k/n · ρ r' (or the seeds when none could be judged)."""
    if line["rows"] == 0:
        return "not run"
    share = (
        f"{line['agree']}/{line['judged']}"
        if line["judged"]
        else f"{line['min_seeds']} seed" + ("" if line["min_seeds"] == 1 else "s")
    )
    rho = "ρ n/a" if math.isnan(line["spearman"]) else f"ρ {line['spearman']:+.2f}"
    return f"{share} · {rho}"


def markdown(progress: pd.DataFrame, title: str, significance: str) -> str:
    """The headline table: per evaluation step, agreeing/judged rows and Spearman's rho, all rows then per group."""
    wide = progress.assign(cell=progress.apply(_cell, axis=1)).pivot(index="step", columns="scope", values="cell")
    wide = wide.reindex(columns=[s for s in SCOPES if s in wide.columns]).rename(columns={"all": "all rows"})
    wide.columns = [c if c == "all rows" else f"({c})" for c in wide.columns]
    legend = (
        f"Each cell: rows whose change in dev PPL against base at that step agrees with the paper / rows judged, "
        f"then Spearman's ρ of dev PPL across rows, ours vs the paper's (a group's ρ includes base; n/a under "
        f"3 rows). Where rows had fewer than {MIN_SEEDS} seeds no verdict is given and the cell says how many "
        f"seeds there were. {significance} Paper values: Vaswani et al. (2017), Table 3."
    )
    return "\n".join(
        [f"# {title}", "", wide.reset_index().to_markdown(index=False, disable_numparse=True), "", legend, ""]
    )


def write(progress: pd.DataFrame, out_dir: Path, budget: str, title: str, significance: str) -> list[Path]:
    """The table as Markdown and the numbers behind it as CSV; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, numbers = out_dir / f"{budget}_by_step.md", out_dir / f"{budget}_by_step.csv"
    write_atomic(md, markdown(progress, title, significance))
    write_atomic(numbers, progress.to_csv(index=False))
    return [md, numbers]
