"""Table 3 mirrored as Markdown (pandas to_markdown), a standalone HTML page and LaTeX booktabs (pandas Styler).

All three show the same cells: the paper's columns with blanks where a value equals base, and beside each of PPL,
BLEU and params ours, the paper's, our change, the paper's change and whether they agree.
"""
from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pandas as pd

from reports.inputs import BudgetResults, shown_path
from reports.table3 import METRICS, PAPER_CONFIG, Summary

METRIC_LABEL = {"ppl": "PPL (dev)", "bleu": "BLEU (dev)", "params": "params ×10⁶"}
DECIMALS = {"ppl": 2, "bleu": 1}  # as the paper prints them
CONFIG_LABEL = {"P_drop": "P_drop", "eps_ls": "ε_ls"}
LATEX_LABEL = {"N": "$N$", "d_model": "$d_\\text{model}$", "d_ff": "$d_\\text{ff}$", "h": "$h$", "d_k": "$d_k$",
               "d_v": "$d_v$", "P_drop": "$P_{drop}$", "ε_ls": "$\\epsilon_{ls}$", "params ×10⁶": "params $\\times 10^6$",
               "Δ ours": "$\\Delta$ ours", "Δ paper": "$\\Delta$ paper"}
PE_TEXT = {"learned": "positional embedding instead of sinusoids", "none": "no positional encoding"}
AGREE_COLOR = {"yes": "#d8f0d8", "no": "#f6d5d5", "n.s.": "#ececec"}
LEGEND = ("Blank configuration cell: same as base, as the paper prints it. Δ: change against the base row "
          "(ours against our base, the paper's against its base); ± is the sample standard deviation over seeds "
          "(for a change, sqrt(sd_row² + sd_base²)). agree: our change points the paper's way (yes/no); n.s.: our "
          "change is zero or smaller than its spread; —: nothing to compare. Rows not run show the paper's changes "
          "to the configuration. Paper values: Vaswani et al. (2017), Table 3.")


def _metric_text(metric: str, value: float, sd: float = math.nan, signed: bool = False) -> str:
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


def _config_value(column: str, value: object) -> str:
    """A configuration value as the paper prints it: integers without a decimal point (pandas may carry 6.0)."""
    if column in ("P_drop", "eps_ls") or not isinstance(value, float) or not value.is_integer():
        return str(value)
    return str(int(value))


def _steps(value: float) -> str:
    return "" if math.isnan(value) else (f"{value / 1000:g}K" if value >= 1000 and value % 100 == 0 else f"{value:.0f}")


def _config_cells(line: pd.Series, base: pd.Series) -> dict[str, str]:
    """The paper's configuration columns: a value only where it differs from base; a changed pe as text (row E)."""
    is_base = line.name == "base"
    cells = {CONFIG_LABEL.get(c, c): _config_value(c, line[c]) if is_base or line[c] != base[c] else ""
             for c in PAPER_CONFIG}
    if line["pe"] != base["pe"]:
        cells["N"] = PE_TEXT.get(line["pe"], f"pe = {line['pe']}")
    steps = line["steps"]
    cells["train steps"] = _steps(steps) if is_base or steps != base["steps"] else ""
    return cells


def _ours_text(line: pd.Series, metric: str) -> str:
    if line["seeds"] == 0:
        return "did not finish" if line["not_finished"] else "not run"
    return _metric_text(metric, line[metric], line[f"{metric}_sd"])


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as strings, columns (section, column) and index (group, row): what every format renders."""
    base = table.loc["base"]
    records = {}
    for name, line in table.iterrows():
        cells = {("", k): v for k, v in _config_cells(line, base).items()}
        for m in METRICS:
            paper = _metric_text(m, line[f"{m}_paper"])
            delta = "" if name == "base" else _metric_text(m, line[f"{m}_delta"], line[f"{m}_spread"], signed=True)
            paper_delta = "" if name == "base" else _metric_text(m, line[f"{m}_paper_delta"], signed=True)
            cells |= {(METRIC_LABEL[m], "ours"): _ours_text(line, m), (METRIC_LABEL[m], "paper"): paper,
                      (METRIC_LABEL[m], "Δ ours"): delta, (METRIC_LABEL[m], "Δ paper"): paper_delta,
                      (METRIC_LABEL[m], "agree"): line[f"{m}_agree"]}
        cells[("", "seeds")] = str(line["seeds"])
        group = line["group"] if line["group"] in ("base", "big") else f"({line['group']})"
        records[(group, name)] = cells
    shown = pd.DataFrame.from_dict(records, orient="index")
    shown.columns = pd.MultiIndex.from_tuples(shown.columns)
    shown.index = pd.MultiIndex.from_tuples(shown.index)
    return shown


def _span(values: pd.Series, text) -> str:
    low, high = text(values.min()), text(values.max())
    return low if low == high else f"{low} to {high}"


def provenance(results: BudgetResults, table: pd.DataFrame) -> list[tuple[str, str]]:
    """What produced the table, for its header: budget, data, device, torch, commit, date, steps, tokens, sacreBLEU."""
    runs = results.runs

    def unique(column: str) -> str:
        values = runs[column].dropna().astype(str).unique() if column in runs else []
        return ", ".join(sorted(values)) or "unknown"

    budget = f"{results.budget} (scaled: a shrunken model and data, for directions, not the paper's values)" \
        if results.scaled else results.budget
    base = table.loc["base"]
    steps = table["steps"].dropna()
    dates = runs["date"].dropna().astype(str) if "date" in runs else pd.Series(dtype=str)
    ran = table.loc[table["seeds"] > 0, "seeds"]
    not_run = [n for n, s, f in zip(table.index, table["seeds"], table["not_finished"]) if s == 0 and f == 0]
    return [
        ("budget", budget),
        ("data", f"preset {unique('preset')}" + "".join(f", {k}={v}" for k, v in results.data.items())),
        ("training", ", ".join(f"{k}={v}" for k, v in results.train.items()) or "unknown"),
        ("model", unique("model_spec")),
        ("device", unique("device")),
        ("torch", unique("torch")),
        ("commit", unique("commit")),
        ("date", f"{dates.min()} to {dates.max()}" if len(dates) else "unknown"),
        ("steps", f"base {_steps(base['steps']) or 'not run'}; all rows {_span(steps, _steps)} (paper: 100K, big 300K)"
                  if len(steps) else "none"),
        ("tokens seen", f"base {base['tokens_seen']:,.0f}" if not math.isnan(base["tokens_seen"]) else "unknown"),
        ("seeds", f"{_span(ran, str)} finished per row that ran; not run: {', '.join(not_run) or 'none'}"
                  if len(ran) else "no finished run"),
        ("sacreBLEU", unique("sacrebleu_signature")),
        ("results", shown_path(results.folder) + (f"; superseded by a newer run of the same row and seed: "
                                                   f"{', '.join(results.superseded)}" if results.superseded else "")),
    ]


def unfinished_note(runs: pd.DataFrame) -> str:
    """Runs that diverged or failed, each with its error, so that no result goes missing silently."""
    if "status" not in runs:
        return ""
    bad = runs[runs["status"] != "finished"]
    errors = bad["error"] if "error" in bad else pd.Series("", index=bad.index)
    return "; ".join(f"{row} seed {seed}: {status}" + (f" ({error})" if isinstance(error, str) and error else "")
                     for row, seed, status, error in zip(bad["row"], bad["seed"], bad["status"], errors))


# --- Markdown --------------------------------------------------------------------------------------------------

def _flat(shown: pd.DataFrame) -> pd.DataFrame:
    """One header row: 'PPL (dev) ours', ...; the group label only on a group's first row, as in the paper."""
    flat = shown.copy()
    flat.columns = [" ".join(p for p in c if p) for c in shown.columns]
    groups = shown.index.get_level_values(0)
    flat.insert(0, "row", shown.index.get_level_values(1))
    flat.insert(0, "", [g if i == 0 or g != groups[i - 1] else "" for i, g in enumerate(groups)])
    return flat.reset_index(drop=True)


def markdown(shown: pd.DataFrame, header: list[tuple[str, str]], summary: Summary, note: str, title: str) -> str:
    lines = [f"# {title}", "", *[f"- **{k}**: {v}" for k, v in header], "", f"**Summary.** {summary.line()}", "",
             _flat(shown).to_markdown(index=False, disable_numparse=True), "", LEGEND]
    if note:
        lines += ["", f"Runs that did not finish: {note}."]
    return "\n".join(lines) + "\n"


# --- HTML ------------------------------------------------------------------------------------------------------

CSS = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; font-size: 13px; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 12px; }
dl.header { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; margin: 0 0 12px; }
dl.header dt { font-weight: bold; } dl.header dd { margin: 0; }
p.summary { font-weight: bold; margin: 12px 0; }
table.table3 { border-collapse: collapse; border-top: 2px solid #222; border-bottom: 2px solid #222; }
table.table3 { font-size: 12px; }
table.table3 th, table.table3 td { padding: 2px 5px; text-align: right; white-space: nowrap; }
table.table3 thead th { text-align: center; border-bottom: 1px solid #222; white-space: normal; }
table.table3 tbody th { text-align: left; font-weight: normal; }
table.table3 span.spill { display: inline-block; width: 0; text-align: left; }  /* row E's text runs across the blank cells, as in the paper */
p.legend { max-width: 1100px; color: #444; }
"""


def _group_rules(shown: pd.DataFrame) -> pd.DataFrame:
    """A rule above the first row of each group, like the paper's horizontal lines between (A), (B), ..."""
    groups = shown.index.get_level_values(0)
    first = [i == 0 or g != groups[i - 1] for i, g in enumerate(groups)]
    return pd.DataFrame([["border-top: 1px solid #888" if f else ""] * shown.shape[1] for f in first],
                        index=shown.index, columns=shown.columns)


def page(shown: pd.DataFrame, header: list[tuple[str, str]], summary: Summary, note: str, title: str) -> str:
    agree = [c for c in shown.columns if c[1] == "agree"]
    styler = (shown.style.set_uuid("table3")  # a fixed id keeps the page identical across rebuilds of the same results
              .apply(_group_rules, axis=None)
              .map(lambda v: f"background-color: {AGREE_COLOR[v]}" if v in AGREE_COLOR else "", subset=agree)
              .format(escape="html")
              .format(lambda v: f'<span class="spill">{html.escape(v)}</span>' if v in PE_TEXT.values() else html.escape(v),
                      subset=[("", "N")])
              .set_table_attributes('class="table3"'))
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in header)
    unfinished = f"<p class=\"legend\">Runs that did not finish: {html.escape(note)}.</p>" if note else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{html.escape(title)}</title>\n"
            f"<style>{CSS}</style>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n<dl class=\"header\">{items}</dl>\n"
            f"<p class=\"summary\">{html.escape(summary.line())}</p>\n{styler.to_html()}\n"
            f"<p class=\"legend\">{html.escape(LEGEND)}</p>\n{unfinished}\n</body>\n</html>\n")


# --- LaTeX -----------------------------------------------------------------------------------------------------

LATEX_TEXT = {"±": "$\\pm$", "−": "$-$", "—": "---", "ε": "$\\epsilon$", "×": "$\\times$", "⁶": "$^6$",
              "&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#"}


def _latex_text(text: str) -> str:
    return "".join(LATEX_TEXT.get(ch, ch) for ch in str(text))


def latex(shown: pd.DataFrame, header: list[tuple[str, str]], summary: Summary, note: str, title: str) -> str:
    """A booktabs table laid out like the paper's: the configuration columns, then ours beside the paper's."""
    labels = {**{k: _latex_text(k) for k in set(shown.columns.get_level_values(0))}, **LATEX_LABEL}
    cells = shown.map(_latex_text).rename(columns=lambda c: labels.get(c, _latex_text(c)))
    caption = _latex_text(f"{title}. {summary.line()}")
    tex = cells.style.to_latex(hrules=True, multicol_align="c", multirow_align="naive", clines="skip-last;data", environment="table",
                               position_float="centering", caption=caption, column_format="ll" + "r" * shown.shape[1])
    tex = re.sub(r"\\cline\{[^}]*\}", r"\\midrule", tex)  # booktabs rules between the groups
    tex = tex.replace("\\midrule\n\\bottomrule", "\\bottomrule")  # none after the last group
    for text in PE_TEXT.values():  # row E's text spans the blank configuration columns, as in the paper
        span = len(PAPER_CONFIG)
        tex = re.sub(re.escape(text) + r"(?:\s*&){%d}" % (span - 1), lambda _: f"\\multicolumn{{{span}}}{{l}}{{{text}}}", tex)
    tex = tex.replace("\\begin{tabular}", "\\resizebox{\\linewidth}{!}{%\n\\begin{tabular}")
    tex = tex.replace("\\end{tabular}", "\\end{tabular}}")  # the table is wider than a page: scaled to the text width
    comments = [f"% {k}: {v}" for k, v in header] + ([f"% did not finish: {note}"] if note else [])
    return "% Generated by `python -m reports` (needs \\usepackage{booktabs,graphicx}).\n" + "\n".join(comments) + "\n" + tex


FORMATS = {"md": markdown, "html": page, "tex": latex}


def write_all(results: BudgetResults, table: pd.DataFrame, summary: Summary, out_dir: Path) -> list[Path]:
    """Table 3 for one budget in every format, plus the numbers behind it as CSV; returns the files written."""
    title = f"Table 3 mirrored: budget {results.budget}" + (" (scaled)" if results.scaled else "")
    shown, header, note = display(table), provenance(results, table), unfinished_note(results.runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for ext, render in FORMATS.items():
        path = out_dir / f"{results.budget}.{ext}"
        path.write_text(render(shown, header, summary, note, title))
        written.append(path)
    numbers = out_dir / f"{results.budget}.csv"
    table.to_csv(numbers)
    return [*written, numbers]
