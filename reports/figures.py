"""Figures (seaborn, Agg backend): when the paper's conclusions appear (agreement and Spearman against steps), our
change against the paper's per row (scatter) and per group, training curves, tokens/s, params against dev PPL (the
heatmaps are in reports/heatmaps.py). Panels with nothing to show are left out.

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
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter  # noqa: E402

from reports.table3 import AGREE, DISAGREE, MIN_SEEDS, NOT_COMPARABLE, NOT_SIGNIFICANT, SE_MULTIPLE, per_run  # noqa: E402

sns.set_theme(context="paper", style="whitegrid")
GROUPS = ("A", "B", "C", "D", "E")
GROUP_COLOR = dict(zip(("base", *GROUPS, "big"), sns.color_palette("deep", 7)))  # one color per group in every panel
SOURCE_COLOR = {"ours": "#4c72b0", "paper": "#c44e52"}

VERDICT_COLOR = {AGREE: "#55a868", DISAGREE: "#c44e52", NOT_SIGNIFICANT: "#999999"}
FEW_SEEDS_COLOR = "#4c72b0"
SCOPE_COLOR = {"all": "#222222", **{g: GROUP_COLOR[g] for g in GROUPS}}


def _save(fig: plt.Figure, path: Path) -> plt.Figure:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return fig


def has_bleu(table: pd.DataFrame) -> bool:
    """Whether any of our BLEU scores is above zero (a budget too short to translate scores 0 everywhere)."""
    return bool((table["bleu"].fillna(0) > 0).any())


def group_changes(table: pd.DataFrame, runs: pd.DataFrame, path: Path, title: str) -> plt.Figure:
    """Per group A-E and metric: our change against base (bars per seed mean, sd as error bar) beside the paper's.

    Ours and the paper's sit in separate panels with their own y axes: a scaled budget's PPL lives on another scale,
    and what should match is the direction and the order within a group.
    """
    base = table.loc["base"]
    mine = per_run(runs).assign(group=lambda d: d["row"].map(table["group"]))
    long = []
    for metric, label in (("ppl", "Δ PPL (dev)"), ("bleu", "Δ BLEU (dev)")):
        long += [
            {"group": g, "row": r, "panel": f"{label}, ours", "change": v - base[metric]}
            for g, r, v in zip(mine["group"], mine["row"], mine[metric])
        ]
        long += [
            {"group": g, "row": r, "panel": f"{label}, paper", "change": d}
            for r, g, d in zip(table.index, table["group"], table[f"{metric}_paper_delta"])
        ]
    data = pd.DataFrame(long)
    data = data[data["group"].isin(GROUPS)]
    if not has_bleu(table):  # nothing to compare: every BLEU of ours is zero or missing
        data = data[~data["panel"].str.startswith("Δ BLEU")]
        title += " (BLEU left out: ours is 0 in every row)"
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
                sns.barplot(
                    subset,
                    x="row",
                    y="change",
                    order=order,
                    errorbar="sd",
                    ax=ax,
                    color=SOURCE_COLOR[panel.rsplit(", ", 1)[1]],
                )
            ax.axhline(0, color="#333", linewidth=0.8)
            ax.set(title=f"({group}) {panel}", xlabel="", ylabel="")
    fig.suptitle(title, y=1.0)
    fig.tight_layout()
    return _save(fig, path)


def training_curves(curves: pd.DataFrame, metric: str, path: Path, title: str, order: list[str]) -> plt.Figure:
    """One panel per row: `metric` (loss or dev_ppl) against step, one line per seed; shared axes (dev PPL on a log
    scale when it spans more than a factor 3) so that the rows can be compared at a glance."""
    data = curves.dropna(subset=[metric])
    rows = [r for r in order if r in set(data["row"])]
    grid = sns.relplot(
        data,
        x="step",
        y=metric,
        col="row",
        col_order=rows,
        col_wrap=min(5, len(rows)),
        hue="seed",
        kind="line",
        estimator=None,
        errorbar=None,
        marker="o" if metric == "dev_ppl" else None,
        height=1.8,
        aspect=1.3,
        facet_kws={"sharey": True, "sharex": True},
        palette="deep",
    )
    values = data[metric]
    if metric == "dev_ppl" and values.max() > 3 * values.min():  # PPL falling from ~1000 to ~10: log scale
        first = grid.axes.flat[0]  # shared axes share the scale and the tickers
        first.set_yscale("log")
        first.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        first.yaxis.set_major_formatter(ScalarFormatter())
        first.yaxis.set_minor_formatter(NullFormatter())
        for ax in grid.axes.flat:
            ax.yaxis.set_tick_params(labelleft=ax.get_subplotspec().is_first_col())
    grid.set_titles("{col_name}")
    grid.set_ylabels({"loss": "training loss", "dev_ppl": "dev PPL"}.get(metric, metric))
    grid.figure.suptitle(title, y=1.02)
    return _save(grid.figure, path)


def agreement_by_step(progress: pd.DataFrame, path: Path, title: str) -> plt.Figure:
    """Against evaluation step, for all rows and per group A-E: the share of judged rows whose change in dev PPL agrees
    with the paper's, and Spearman's rho of dev PPL with the paper's. Shared step axis; the share panel is left out
    when no row could be judged (fewer than MIN_SEEDS seeds)."""
    panels = [("spearman", "Spearman ρ of dev PPL, ours vs paper", (-1.05, 1.05))]
    if progress["share"].notna().any():
        panels.insert(0, ("share", "share of judged rows agreeing with the paper", (-0.03, 1.03)))
    else:
        title += f"\n(agreement share left out: no row has {MIN_SEEDS} seeds, so none is judged)"
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels) + 0.4), sharex=True, squeeze=False)
    for ax, (column, label, limits) in zip(axes[:, 0], panels):
        for scope, lines in progress.groupby("scope", sort=False):
            lines = lines.dropna(subset=[column])
            if len(lines):
                ax.plot(
                    lines["step"],
                    lines[column],
                    marker="o",
                    markersize=3,
                    color=SCOPE_COLOR[scope],
                    linewidth=2.2 if scope == "all" else 1.1,
                    label="all rows" if scope == "all" else f"({scope})",
                )
        ax.axhline(0.5 if column == "share" else 0.0, color="#888", linewidth=0.8, linestyle="--")
        ax.set(ylabel=label, ylim=limits)
        ax.yaxis.label.set_size(8)
    axes[-1, 0].set_xlabel("training step (dev PPL evaluated)")
    drawn = {}  # label -> line, over both panels: a group may have a rho at some step and no judged row at any
    for ax in axes[:, 0]:
        drawn.update((line.get_label(), line) for line in ax.get_lines() if not line.get_label().startswith("_"))
    axes[0, 0].legend(
        list(drawn.values()), list(drawn), loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=8
    )
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _verdict_color(verdict: str) -> str:
    return VERDICT_COLOR.get(verdict, FEW_SEEDS_COLOR)


QUADRANTS = {  # (paper's change > 0, ours > 0) -> label, for a metric where lower is better (PPL)
    (True, True): "both worse",
    (False, False): "both better",
    (False, True): "paper better, ours worse",
    (True, False): "paper worse, ours better",
}


def change_against_change(table: pd.DataFrame, path: Path, title: str) -> plt.Figure:
    """Per row, our change against base (y, with ±2 standard errors) against the paper's (x), coloured by verdict,
    the four quadrants labelled; one panel per metric (BLEU left out when ours is 0 everywhere). Each axis has its
    own scale: a scaled budget's changes are not the paper's size, only their signs and order should match."""
    metrics = [("ppl", "dev PPL", True)] + ([("bleu", "dev BLEU", False)] if has_bleu(table) else [])
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.6), squeeze=False)
    verdicts = set()
    for ax, (m, label, lower_better) in zip(axes[0], metrics):
        points = table.drop(index="base")
        points = points[points[f"{m}_agree"] != NOT_COMPARABLE].dropna(subset=[f"{m}_delta", f"{m}_paper_delta"])
        for name, line in points.iterrows():
            verdict = line[f"{m}_agree"]
            verdicts.add(verdict)
            error = SE_MULTIPLE * line[f"{m}_se"]
            ax.errorbar(
                line[f"{m}_paper_delta"],
                line[f"{m}_delta"],
                yerr=None if pd.isna(error) else error,
                fmt="o",
                color=_verdict_color(verdict),
                markersize=5,
                elinewidth=0.8,
                capsize=2,
            )
            ax.annotate(
                name,
                (line[f"{m}_paper_delta"], line[f"{m}_delta"]),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
            )
        ax.axhline(0, color="#333", linewidth=0.8)
        ax.axvline(0, color="#333", linewidth=0.8)
        ax.margins(0.25)
        for (paper_up, ours_up), text in QUADRANTS.items():
            if not lower_better:  # higher BLEU is better: the same quadrant means the opposite
                text = text.replace("worse", "WORSE").replace("better", "worse").replace("WORSE", "better")
            ax.text(
                0.98 if paper_up else 0.02,
                0.98 if ours_up else 0.02,
                text,
                transform=ax.transAxes,
                ha="right" if paper_up else "left",
                va="top" if ours_up else "bottom",
                fontsize=7,
                color="#555",
                style="italic",
            )
        ax.set(
            xlabel=f"paper's change in {label} against base", ylabel=f"our change in {label} against base", title=label
        )
    handles = [
        Line2D([], [], marker="o", linestyle="", color=_verdict_color(v), label=v)
        for v in (AGREE, DISAGREE, NOT_SIGNIFICANT, *sorted(v for v in verdicts if v not in VERDICT_COLOR))
        if v in verdicts
    ]
    fig.legend(handles=handles, title="verdict", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def tokens_per_second(runs: pd.DataFrame, path: Path, title: str, order: list[str]) -> plt.Figure:
    """Training throughput per row (mean over seeds, sd as error bar) and, where the runs measured it, the share of
    the machine's fp32 GEMM rate that the step's model FLOPs reach."""
    data = runs.dropna(subset=["tokens_per_s"])
    rows = [r for r in order if r in set(data["row"])]
    panels = [("tokens_per_s", "training tokens/s")]
    if "gemm_fraction" in data and data["gemm_fraction"].notna().any():
        panels.append(("gemm_fraction", "share of the GEMM rate"))
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(max(4.0, 0.45 * len(rows) + 1), 3 * len(panels)), sharex=True, squeeze=False
    )
    for ax, (column, label) in zip(axes[:, 0], panels):
        sns.barplot(data, x="row", y=column, order=rows, errorbar="sd", ax=ax, color=SOURCE_COLOR["ours"])
        ax.set(xlabel="", ylabel=label)
        ax.tick_params(axis="x", rotation=90)
    axes[0, 0].set_title(title)
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
    handles = [
        Line2D([], [], marker="o", linestyle="", color=c, label=g) for g, c in GROUP_COLOR.items() if g in groups
    ]
    fig.legend(handles=handles, title="group", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
