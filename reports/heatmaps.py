"""The categorical heatmaps: the invariants' verdict per model and property, the mutant kill matrix, and Table 3's
verdicts against the paper under several budgets side by side."""

from __future__ import annotations

import functools
from pathlib import Path

from reports import figures  # first: it sets matplotlib's file-only backend before pyplot loads

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from reports.table3 import AGREE, DISAGREE, MIN_SEEDS, NOT_COMPARABLE, NOT_SIGNIFICANT, Summary, summarize
from reports.table3_text import metric_text

# verdict -> (color, cell label, legend entry); "missing" is a property a report does not cover
VERDICTS = {
    "pass": ("#55a868", "pass", "pass"),
    "fail": ("#c44e52", "FAIL", "fail"),
    "not_applicable": ("#bbbbbb", "n/a", "not applicable"),
    "missing": ("#ffffff", "", "not in the report"),
}


KILLS = {
    "fail": ("#c44e52", "x", "x: the property fails, killing the mutant"),
    "pass": ("#eeeeee", "", "passes"),
    "not_applicable": ("#bbbbbb", "n/a", "not applicable"),
    "missing": ("#ffffff", "", "not in the matrix"),
}


def budgets_side_by_side(tables: dict[str, pd.DataFrame], path: Path, title: str) -> plt.Figure:
    """The verdicts of several budgets' grids side by side: one panel per metric, Table 3 rows down, budgets across,
    each cell coloured by the row's verdict against the paper and labelled with our change against base; each
    budget's column names its agreement share and Spearman's rho. Rows no budget ran are left out."""
    metrics = [m for m in ("ppl", "bleu") if m == "ppl" or any(figures.has_bleu(t) for t in tables.values())]
    first = next(iter(tables.values()))
    rows = [r for r in first.index if r != "base" and any(t.loc[r, "seeds"] > 0 for t in tables.values())]
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(1.2 + 2.1 * len(tables) * len(metrics), 1.4 + 0.28 * len(rows)), squeeze=False
    )
    palette = {
        **figures.VERDICT_COLOR,
        "few seeds": figures.FEW_SEEDS_COLOR,
        NOT_COMPARABLE: "#ffffff",
        "not run": "#ffffff",
    }
    summaries = {budget: summarize(table) for budget, table in tables.items()}
    shown = set()
    for ax, m in zip(axes[0], metrics):
        kinds, labels = _budget_cells(tables, rows, m, _budget_columns(summaries, m), palette)
        shown |= set(kinds.to_numpy().ravel())
        _draw_budget_panel(ax, kinds, labels, first.loc[rows, f"{m}_paper_delta"], m, palette)
    _budget_legend(fig, palette, shown)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return figures._save(fig, path)


def _budget_columns(summaries: dict[str, Summary], metric: str) -> dict[str, str]:
    """Each budget's column label, naming its agreement share (and Spearman's rho for PPL), mapped to the budget."""
    columns = {}
    for budget, summary in summaries.items():
        share = summary.tallies[metric].share
        rho = "" if metric != "ppl" or pd.isna(summary.spearman_ppl) else f", ρ {summary.spearman_ppl:+.2f}"
        columns[f"{budget}\n{'n/a' if pd.isna(share) else f'{share:.0%}'} agree{rho}"] = budget
    return columns


def _budget_cells(
    tables: dict[str, pd.DataFrame], rows: list[str], metric: str, columns: dict[str, str], palette: dict[str, str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One panel's cells, rows by budget columns: the verdict kind that colours each, and our change that labels it."""
    verdicts = pd.DataFrame(
        {
            label: [tables[b].loc[r, f"{metric}_agree"] if tables[b].loc[r, "seeds"] > 0 else "not run" for r in rows]
            for label, b in columns.items()
        },
        index=rows,
    )
    changes = pd.DataFrame(
        {label: [tables[b].loc[r, f"{metric}_delta"] for r in rows] for label, b in columns.items()}, index=rows
    )
    labels = changes.map(functools.partial(metric_text, metric, signed=True))  # as the Table 3 report prints it
    kinds = verdicts.map(lambda v: v if v in palette else "few seeds")
    return kinds, labels


def _draw_budget_panel(
    ax: plt.Axes, kinds: pd.DataFrame, labels: pd.DataFrame, paper: pd.Series, metric: str, palette: dict[str, str]
) -> None:
    """Draw one metric's panel, each row's tick naming the paper's change beside the row."""
    rows = list(kinds.index)
    sns.heatmap(
        kinds.map(list(palette).index),
        annot=labels,
        fmt="",
        cbar=False,
        vmin=-0.5,
        vmax=len(palette) - 0.5,
        cmap=ListedColormap(list(palette.values())),
        linewidths=0.5,
        linecolor="#dddddd",
        annot_kws={"fontsize": 7},
        ax=ax,
    )
    ax.set_yticks(
        [i + 0.5 for i in range(len(rows))],
        [f"{r} (paper {d:+.2g})" if pd.notna(d) else r for r, d in zip(rows, paper)],
        rotation=0,
        fontsize=7,
    )
    ax.tick_params(axis="x", rotation=0, labelsize=7)
    ax.set(xlabel="", ylabel="", title=f"change in dev {metric.upper()} against base")


def _budget_legend(fig: plt.Figure, palette: dict[str, str], shown: set[str]) -> None:
    """The legend under the panels, naming only the verdict kinds some cell shows."""
    legend = {
        AGREE: "agrees",
        DISAGREE: "disagrees",
        NOT_SIGNIFICANT: "not significant",
        "few seeds": f"fewer than {MIN_SEEDS} seeds",
        "not run": "not run / no paper value",
    }
    fig.legend(
        handles=[
            Patch(facecolor=palette[k], edgecolor="#999", label=text)
            for k, text in legend.items()
            if k in shown or (k == "not run" and NOT_COMPARABLE in shown)
        ],
        loc="lower center",
        ncol=5,
        frameon=False,
        fontsize=7,
        bbox_to_anchor=(0.5, -0.02),
    )


def verdict_heatmap(long: pd.DataFrame, index: str, path: Path, title: str, palette: dict) -> plt.Figure:
    """A categorical heatmap: `index` (models or mutants) by property, each cell colored and labelled by verdict;
    each row's label counts its failing properties (for a mutant, 0 means no property catches it)."""
    wide = long.pivot_table(index=index, columns="property", values="verdict", aggfunc="first", sort=False)
    wide = wide.fillna("missing").where(wide.isin(list(palette)), "missing")
    wide.index = [f"{name} ({(row == 'fail').sum()} fail)" for name, row in wide.iterrows()]
    codes = wide.map(list(palette).index)
    labels = wide.map(lambda v: palette[v][1])
    fig, ax = plt.subplots(figsize=(2.0 + 0.32 * wide.shape[1], 1.6 + 0.3 * wide.shape[0]))
    sns.heatmap(
        codes,
        annot=labels,
        fmt="",
        cmap=ListedColormap([c for c, _, _ in palette.values()]),
        vmin=-0.5,
        vmax=len(palette) - 0.5,
        cbar=False,
        linewidths=0.5,
        linecolor="white",
        annot_kws={"fontsize": 7},
        ax=ax,
    )
    ax.set(xlabel="", ylabel="")
    ax.set_title(title, pad=22)
    ax.tick_params(axis="x", rotation=90)
    ax.tick_params(axis="y", rotation=0)
    shown = set(wide.to_numpy().ravel())
    ax.legend(
        handles=[Patch(facecolor=c, edgecolor="#999", label=text) for v, (c, _, text) in palette.items() if v in shown],
        loc="lower left",
        bbox_to_anchor=(0, 1.0),
        ncol=4,
        frameon=False,
        fontsize=7,
    )
    return figures._save(fig, path)
