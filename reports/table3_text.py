"""How a Table 3 report reads its numbers and says where they came from: a metric as the paper prints it, the
header of provenance (budget, data, device, commit, steps, throughput) and the budget's one-line headline."""

from __future__ import annotations

import math

import pandas as pd

from ablations.data.corpora import PRESETS
from ablations.grid.health import PUBLISHED as BASELINE
from plumbing.files import shown_path
from reports.inputs import BudgetResults
from reports.table3 import PAPER_CONFIG, Summary, count_rows

CONFIG_LABEL = {"P_drop": "P_drop", "eps_ls": "ε_ls"}


def config_value(column: str, value: object) -> str:
    """A configuration value as the paper prints it: integers without a decimal point (pandas may carry 6.0)."""
    if column in ("P_drop", "eps_ls") or not isinstance(value, float) or not value.is_integer():
        return str(value)
    return str(int(value))


DECIMALS = {"ppl": 2, "bleu": 1}  # as the paper prints them


def metric_text(metric: str, value: float, sd: float = math.nan, signed: bool = False) -> str:
    """A metric as the paper prints it (PPL 2 decimals, BLEU 1, params in millions to 3 significant digits: 63.1,
    213, 0.764 for a scaled model), with ± sd when there is a spread."""
    if math.isnan(value):
        return ""
    sign = "+" if signed else ""
    if metric == "params":
        text, spread = f"{value:{sign}.3g}", f"{sd:.2g}"
    else:
        text, spread = f"{value:{sign}.{DECIMALS[metric]}f}", f"{sd:.{DECIMALS[metric]}f}"
    text = text.replace("-", "−")
    return f"{text} ± {spread}" if not math.isnan(sd) and sd > 0 else text


def steps_text(value: float) -> str:
    return "" if math.isnan(value) else (f"{value / 1000:g}K" if value >= 1000 and value % 100 == 0 else f"{value:.0f}")


def _span(values: pd.Series, text) -> str:
    low, high = text(values.min()), text(values.max())
    return low if low == high else f"{low} to {high}"


def _throughput(base: pd.Series) -> str:
    """The base row's training speed (medians over its seeds), each figure shown when known."""
    parts = [
        f"{base['tokens_per_s']:,.0f} source+target tokens/s in training"
        if not math.isnan(base["tokens_per_s"])
        else "",
        f"{base['gemm_fraction']:.0%} of the machine's measured GEMM rate"
        if not math.isnan(base["gemm_fraction"])
        else "",
    ]
    known = ", ".join(part for part in parts if part)
    return f"base {known} (median over seeds; every row's in the HTML and CSV tables)" if known else "unknown"


def provenance(results: BudgetResults, table: pd.DataFrame) -> list[tuple[str, str]]:
    """What produced the table, for its header: budget, data, device, torch, commit, date, steps, tokens, throughput,
    sacreBLEU."""
    runs = results.runs

    def unique(column: str) -> str:
        values = runs[column].dropna().astype(str).unique() if column in runs else []
        return ", ".join(sorted(values)) or "unknown"

    budget = (
        f"{results.budget} (scaled: a shrunken model and data, for directions, not the paper's values)"
        if results.scaled
        else results.budget
    )
    base = table.loc["base"]
    steps = table["steps"].dropna()
    dates = runs["date"].dropna().astype(str) if "date" in runs else pd.Series(dtype=str)
    ran = table.loc[table["seeds"] > 0, "seeds"]
    not_run = [n for n, s, f in zip(table.index, table["seeds"], table["not_finished"]) if s == 0 and f == 0]
    base_config = ", ".join(f"{CONFIG_LABEL.get(c, c)}={config_value(c, base[c])}" for c in (*PAPER_CONFIG, "pe"))
    return [
        ("budget", budget),
        ("base configuration", base_config),
        ("data", f"preset {unique('preset')}" + "".join(f", {k}={v}" for k, v in results.data.items())),
        ("training", ", ".join(f"{k}={v}" for k, v in results.train.items()) or "unknown"),
        ("model", unique("model_spec")),
        ("device", unique("device")),
        ("torch", unique("torch")),
        ("commit", unique("commit")),
        ("date", f"{dates.min()} to {dates.max()}" if len(dates) else "unknown"),
        (
            "steps",
            f"base {steps_text(base['steps']) or 'not run'}; all rows {_span(steps, steps_text)} (paper: 100K, big 300K)"
            if len(steps)
            else "none",
        ),
        ("tokens seen", f"base {base['tokens_seen']:,.0f}" if not math.isnan(base["tokens_seen"]) else "unknown"),
        ("throughput", _throughput(base)),
        (
            "seeds",
            f"{_span(ran, str)} finished per row that ran; not run: {', '.join(not_run) or 'none'}"
            if len(ran)
            else "no finished run",
        ),
        ("learning", learning_text(results, list(table.index))),
        ("sacreBLEU", unique("sacrebleu_signature")),
        (
            "results",
            shown_path(results.folder)
            + (
                f"; superseded by a newer run of the same row and seed: {', '.join(results.superseded)}"
                if results.superseded
                else ""
            ),
        ),
    ]


def learning_text(results: BudgetResults, rows: list[str]) -> str:
    """How many finished runs left the unigram plateau, and which ended on it or collapsed (ablations/grid/health.py)."""
    baseline = results.baseline
    if baseline is None:
        return f"not judged: no readable {BASELINE} beside the results (`python -m ablations publish` writes it)"
    runs = results.runs[results.runs["status"] == "finished"] if "status" in results.runs else results.runs.iloc[:0]
    if runs.empty:
        return "no finished run"
    runs = runs.assign(order=[rows.index(r) if r in rows else len(rows) for r in runs["row"]])
    runs = runs.sort_values(["order", "seed"])
    runs = runs.assign(verdict=[baseline.verdict(p) for p in runs["dev_ppl"]])
    learned, plateau, collapsed = (runs[runs["verdict"] == v] for v in ("learns", "plateau", "collapsed"))

    def listed(of: pd.DataFrame) -> str:
        return ", ".join(f"{r} seed {s} ({p:.0f})" for r, s, p in zip(of["row"], of["seed"], of["dev_ppl"])) or "none"

    span = f" (dev PPL {learned['dev_ppl'].min():.1f} to {learned['dev_ppl'].max():.1f})" if len(learned) else ""
    return (
        f"{len(learned)} of {len(runs)} finished runs left the unigram plateau{span}; on it: {listed(plateau)}; "
        f"collapsed: {listed(collapsed)} ({baseline.rule()})"
    )


def unfinished_note(runs: pd.DataFrame) -> str:
    """Runs that diverged or failed, each with its error, so that no result goes missing silently."""
    if "status" not in runs:
        return ""
    bad = runs[runs["status"] != "finished"]
    errors = bad["error"] if "error" in bad else pd.Series("", index=bad.index)
    return "; ".join(
        f"{row} seed {seed}: {status}" + (f" ({error})" if isinstance(error, str) and error else "")
        for row, seed, status, error in zip(bad["row"], bad["seed"], bad["status"], errors)
    )


def init_text(runs: pd.DataFrame) -> str:
    """The init rule base's runs started from (model/init.py); runs recorded before the rule was a config field drew
    Xavier at their own width."""
    base = runs[runs["row"] == "base"] if "row" in runs else runs.iloc[:0]
    init = base["init"].dropna().iloc[0] if "init" in base and base["init"].notna().any() else "xavier"
    width = base["init_width"].dropna().iloc[0] if "init_width" in base and base["init_width"].notna().any() else 0
    if init == "normal":
        return "init N(0, 0.02)"
    return f"Xavier init with the stds of d_model {width:.0f}" if width else "Xavier init at its own width"


def headline(results: BudgetResults, table: pd.DataFrame, summary: Summary) -> str:
    """The budget's summary line: what was trained (sizes, data, steps, seeds), base's dev BLEU, and at the final step
    the share of rows agreeing with the paper and Spearman's rho of PPL, whatever they are."""
    base, paper_width = table.loc["base"], 512
    width = base["d_model"]
    sizes = (
        "the paper's sizes"
        if math.isnan(width) or width == paper_width
        else f"scaled sizes (d_model {width:.0f} = the paper's /{paper_width / width:g})"
    )
    presets = results.runs["preset"].dropna().unique() if "preset" in results.runs else []
    data = (
        ", ".join(f"{p} (dev {PRESETS[p].dev})" if p in PRESETS else str(p) for p in sorted(presets)) or "unknown data"
    )
    limits = [
        f"first {results.data[k]} {what} pairs"
        for k, what in (("max_train_pairs", "training"), ("dev_pairs", "dev"))
        if results.data.get(k)
    ]
    data += "".join(f", {limit}" for limit in limits) + ("" if "wmt14" in presets else ", not the paper's WMT 2014")
    ran = table.loc[table["seeds"] > 0, "seeds"]
    seeds = f"{_span(ran, str)} seed{'' if ran.max() == 1 else 's'} per row" if len(ran) else "no finished run"
    steps = f"{steps_text(base['steps'])} steps (base)" if not math.isnan(base["steps"]) else "base not finished"
    bleu = "not finished" if base["seeds"] == 0 else metric_text("bleu", base["bleu"], base["bleu_sd"])
    ppl = summary.tallies["ppl"]
    share = (
        f"{ppl.share:.0%} ({ppl.agree} of {ppl.judged} judged rows)"
        if ppl.judged
        else f"no verdict (fewer than 3 seeds: {count_rows(ppl.few_seeds)})"
    )
    rho = "n/a" if math.isnan(summary.spearman_ppl) else f"{summary.spearman_ppl:.2f} over {summary.spearman_rows} rows"
    return (
        f"Budget {results.budget}: {sizes}, {init_text(results.runs)}, {data}, {steps}, {seeds}. Base dev BLEU {bleu}. At the final step: "
        f"dev-PPL changes agreeing with the paper {share}; Spearman ρ of dev PPL vs the paper's {rho}."
    )
