"""Figures (seaborn, Agg backend): our changes against the paper's per group, training curves, tokens/s, params
against dev PPL, and the invariants verdict and mutant kill matrices as heatmaps.

Each function draws one figure from data already read (reports.inputs, reports.table3), saves it as PNG and
returns the matplotlib Figure so that tests can read its panels.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from reports.table3 import per_run  # noqa: E402

sns.set_theme(context="paper", style="whitegrid")
GROUPS = ("A", "B", "C", "D", "E")
GROUP_COLOR = dict(zip(("base", *GROUPS, "big"), sns.color_palette("deep", 7)))  # one color per group in every panel
SOURCE_COLOR = {"ours": "#4c72b0", "paper": "#c44e52"}
# verdict -> (color, cell label, legend entry); "missing" is a property a report does not cover
VERDICTS = {"pass": ("#55a868", "pass", "pass"), "fail": ("#c44e52", "FAIL", "fail"),
            "not_applicable": ("#bbbbbb", "n/a", "not applicable"), "missing": ("#ffffff", "", "not in the report")}
KILLS = {"fail": ("#c44e52", "x", "x: the property fails, killing the mutant"), "pass": ("#eeeeee", "", "passes"),
         "not_applicable": ("#bbbbbb", "n/a", "not applicable"), "missing": ("#ffffff", "", "not in the matrix")}

def _save(fig: plt.Figure, path: Path) -> plt.Figure:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return fig


def group_changes(table: pd.DataFrame, runs: pd.DataFrame, path: Path, title: str) -> plt.Figure:
    """Per group A-E and metric: our change against base (bars per seed mean, sd as error bar) beside the paper's.

    Ours and the paper's sit in separate panels with their own y axes: a scaled budget's PPL lives on another scale,
    and what should match is the direction and the order within a group.
    """
    base = table.loc["base"]
    mine = per_run(runs).assign(group=lambda d: d["row"].map(table["group"]))
    long = []
    for metric, label in (("ppl", "Δ PPL (dev)"), ("bleu", "Δ BLEU (dev)")):
        long += [{"group": g, "row": r, "panel": f"{label}, ours", "change": v - base[metric]}
                 for g, r, v in zip(mine["group"], mine["row"], mine[metric])]
        long += [{"group": g, "row": r, "panel": f"{label}, paper", "change": d}
                 for r, g, d in zip(table.index, table["group"], table[f"{metric}_paper_delta"])]
    data = pd.DataFrame(long)
    data = data[data["group"].isin(GROUPS)]
    panels = list(dict.fromkeys(data["panel"]))
    fig, axes = plt.subplots(len(GROUPS), len(panels), figsize=(3.2 * len(panels), 2.1 * len(GROUPS)), squeeze=False)
    for i, group in enumerate(GROUPS):
        order = [r for r in table.index if table.loc[r, "group"] == group]
        for j, panel in enumerate(panels):
            ax = axes[i, j]
            subset = data[(data["group"] == group) & (data["panel"] == panel)].dropna(subset=["change"])
            if subset.empty:
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, color="#777")
                ax.set_xticks([])
            else:
                sns.barplot(subset, x="row", y="change", order=order, errorbar="sd", ax=ax,
                            color=SOURCE_COLOR[panel.rsplit(", ", 1)[1]])
            ax.axhline(0, color="#333", linewidth=0.8)
            ax.set(title=f"({group}) {panel}", xlabel="", ylabel="")
    fig.suptitle(title, y=1.0)
    fig.tight_layout()
    return _save(fig, path)


def training_curves(curves: pd.DataFrame, metric: str, path: Path, title: str, order: list[str]) -> plt.Figure:
    """One panel per row: `metric` (loss or dev_ppl) against step, one line per seed."""
    data = curves.dropna(subset=[metric])
    rows = [r for r in order if r in set(data["row"])]
    grid = sns.relplot(data, x="step", y=metric, col="row", col_order=rows, col_wrap=min(5, len(rows)),
                       hue="seed", kind="line", estimator=None, errorbar=None, marker="o" if metric == "dev_ppl" else None,
                       height=1.8, aspect=1.3, facet_kws={"sharey": metric == "loss"}, palette="deep")
    grid.set_titles("{col_name}")
    grid.set_ylabels({"loss": "training loss", "dev_ppl": "dev PPL"}.get(metric, metric))
    grid.figure.suptitle(title, y=1.02)
    return _save(grid.figure, path)


def tokens_per_second(runs: pd.DataFrame, path: Path, title: str, order: list[str]) -> plt.Figure:
    """Training throughput per row (mean over seeds, sd as error bar)."""
    data = runs.dropna(subset=["tokens_per_s"])
    rows = [r for r in order if r in set(data["row"])]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(rows) + 1), 3))
    sns.barplot(data, x="row", y="tokens_per_s", order=rows, errorbar="sd", ax=ax, color=SOURCE_COLOR["ours"])
    ax.set(title=title, xlabel="", ylabel="training tokens/s")
    ax.tick_params(axis="x", rotation=90)
    return _save(fig, path)


def params_against_ppl(table: pd.DataFrame, path: Path, title: str) -> plt.Figure:
    """Parameters against dev PPL for every row, ours and the paper's (rows whose params the paper prints)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    groups = set()
    for ax, source, x, y in ((axes[0], "ours", "params", "ppl"), (axes[1], "paper", "params_paper", "ppl_paper")):
        points = table[[x, y, "group"]].dropna(subset=[x, y])
        groups |= set(points["group"])
        sns.scatterplot(points, x=x, y=y, hue="group", palette=GROUP_COLOR, ax=ax, s=40, legend=False)
        for name, px, py in zip(points.index, points[x], points[y]):
            ax.annotate(name, (px, py), xytext=(3, 3), textcoords="offset points", fontsize=7)
        ax.set(title=source, xlabel="params ×10⁶", ylabel="dev PPL")
    handles = [Line2D([], [], marker="o", linestyle="", color=c, label=g) for g, c in GROUP_COLOR.items() if g in groups]
    fig.legend(handles=handles, title="group", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def verdict_heatmap(long: pd.DataFrame, index: str, path: Path, title: str, palette: dict) -> plt.Figure:
    """A categorical heatmap: `index` (models or mutants) by property, each cell colored and labelled by verdict;
    each row's label counts its failing properties (for a mutant, 0 means no property catches it)."""
    wide = long.pivot_table(index=index, columns="property", values="verdict", aggfunc="first", sort=False)
    wide = wide.fillna("missing").where(wide.isin(list(palette)), "missing")
    wide.index = [f"{name} ({(row == 'fail').sum()} fail)" for name, row in wide.iterrows()]
    codes = wide.map(list(palette).index)
    labels = wide.map(lambda v: palette[v][1])
    fig, ax = plt.subplots(figsize=(2.0 + 0.32 * wide.shape[1], 1.6 + 0.3 * wide.shape[0]))
    sns.heatmap(codes, annot=labels, fmt="", cmap=ListedColormap([c for c, _, _ in palette.values()]),
                vmin=-0.5, vmax=len(palette) - 0.5, cbar=False, linewidths=0.5, linecolor="white",
                annot_kws={"fontsize": 7}, ax=ax)
    ax.set(xlabel="", ylabel="")
    ax.set_title(title, pad=22)
    ax.tick_params(axis="x", rotation=90)
    ax.tick_params(axis="y", rotation=0)
    shown = set(wide.to_numpy().ravel())
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#999", label=text) for v, (c, _, text) in palette.items() if v in shown],
              loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, frameon=False, fontsize=7)
    return _save(fig, path)
