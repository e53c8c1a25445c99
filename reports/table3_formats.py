"""Table 3 mirrored as Markdown (pandas to_markdown), a standalone HTML page and LaTeX booktabs (pandas Styler).

HTML and LaTeX show the wide table: the paper's columns with blanks where a value equals base, and beside each of
PPL, BLEU and params ours, the paper's, our change, the paper's change and the verdict, then each row's training
throughput (source + target tokens/s, and that rate's share of the machine's GEMM rate). The Markdown is narrow enough
for a code host: each row's change to the configuration as text, the paper's and our PPL, BLEU and params side by
side, and the changes with their verdicts in one compact column.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pandas as pd

from plumbing.files import write_atomic
from reports.inputs import BudgetResults
from reports.page import document, stylesheet
from reports.progress import changes_by_step
from reports.table3 import METRICS, MIN_SEEDS, PAPER_CONFIG, SIGNIFICANCE, Summary, missing_conclusions
from reports.table3_text import (
    CONFIG_LABEL,
    config_value,
    headline,
    metric_text,
    provenance,
    steps_text,
    unfinished_note,
)

METRIC_LABEL = {"ppl": "PPL (dev)", "bleu": "BLEU (dev)", "params": "params ×10⁶"}
LATEX_LABEL = {
    "N": "$N$",
    "d_model": "$d_\\text{model}$",
    "d_ff": "$d_\\text{ff}$",
    "h": "$h$",
    "d_k": "$d_k$",
    "d_v": "$d_v$",
    "P_drop": "$P_{drop}$",
    "ε_ls": "$\\epsilon_{ls}$",
    "params ×10⁶": "params $\\times 10^6$",
    "Δ ours": "$\\Delta$ ours",
    "Δ paper": "$\\Delta$ paper",
}
PE_TEXT = {"learned": "positional embedding instead of sinusoids", "none": "no positional encoding"}
AGREE_COLOR = {"yes": "#d8f0d8", "no": "#f6d5d5", "n.s.": "#ececec"}
LEGEND = (
    "Blank configuration cell: same as base, as the paper prints it. Δ: change against the base row "
    "(ours against our base, the paper's against its base). ± after a value is the sample standard deviation "
    "over seeds, after a change its standard error. agree: the verdict; —: nothing to compare. "
    f"{SIGNIFICANCE} Rows not run show the paper's changes to the configuration. "
    "Paper values: Vaswani et al. (2017), Table 3."
)


def _config_cells(line: pd.Series, base: pd.Series) -> dict[str, str]:
    """The paper's configuration columns: a value only where it differs from base; a changed pe as text (row E)."""
    is_base = line.name == "base"
    cells = {
        CONFIG_LABEL.get(c, c): config_value(c, line[c]) if is_base or line[c] != base[c] else "" for c in PAPER_CONFIG
    }
    if line["pe"] != base["pe"]:
        cells["N"] = PE_TEXT.get(line["pe"], f"pe = {line['pe']}")
    steps = line["steps"]
    cells["train steps"] = steps_text(steps) if is_base or steps != base["steps"] else ""
    return cells


def _ours_text(line: pd.Series, metric: str) -> str:
    if line["seeds"] == 0:
        return "did not finish" if line["not_finished"] else "not run"
    return metric_text(metric, line[metric], line[f"{metric}_sd"])


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as strings, columns (section, column) and index (group, row): what every format renders."""
    base = table.loc["base"]
    records = {}
    for name, line in table.iterrows():
        cells = {("", k): v for k, v in _config_cells(line, base).items()}
        for m in METRICS:
            paper = metric_text(m, line[f"{m}_paper"])
            delta = "" if name == "base" else metric_text(m, line[f"{m}_delta"], line[f"{m}_se"], signed=True)
            paper_delta = "" if name == "base" else metric_text(m, line[f"{m}_paper_delta"], signed=True)
            cells |= {
                (METRIC_LABEL[m], "ours"): _ours_text(line, m),
                (METRIC_LABEL[m], "paper"): paper,
                (METRIC_LABEL[m], "Δ ours"): delta,
                (METRIC_LABEL[m], "Δ paper"): paper_delta,
                (METRIC_LABEL[m], "agree"): line[f"{m}_agree"],
            }
        cells[("", "seeds")] = str(line["seeds"])
        cells[("training", "tok/s")] = "" if math.isnan(line["tokens_per_s"]) else f"{line['tokens_per_s']:,.0f}"
        cells[("training", "GEMM share")] = "" if math.isnan(line["gemm_fraction"]) else f"{line['gemm_fraction']:.0%}"
        group = line["group"] if line["group"] in ("base", "big") else f"({line['group']})"
        records[(group, name)] = cells
    shown = pd.DataFrame.from_dict(records, orient="index")
    shown.columns = pd.MultiIndex.from_tuples(shown.columns)
    shown.index = pd.MultiIndex.from_tuples(shown.index)
    return shown


# --- Markdown --------------------------------------------------------------------------------------------------

SHORT = {"ppl": "PPL", "bleu": "BLEU", "params": "params"}


def _changes_text(line: pd.Series, base: pd.Series) -> str:
    """A row's configuration as its changes against base, e.g. 'h=1, d_k=64, d_v=64' (our values: a budget may scale)."""
    changed = [
        f"{CONFIG_LABEL.get(c, c)}={config_value(c, line[c])}" for c in (*PAPER_CONFIG, "pe") if line[c] != base[c]
    ]
    if line["steps"] != base["steps"] and not math.isnan(line["steps"]):
        changed.append(f"steps={steps_text(line['steps'])}")
    return ", ".join(changed)


def _verdicts_text(line: pd.Series) -> str:
    """PPL and BLEU changes in one cell: 'PPL +1.00/+0.37 yes · BLEU −2.0/−0.9 yes' (ours/paper, then the verdict);
    a paper change of zero prints as 0 (no change expected); one seed count shared by both prints once."""
    shown = [m for m in ("ppl", "bleu") if not math.isnan(line[f"{m}_delta"])]
    verdicts = {line[f"{m}_agree"] for m in shown}
    shared = verdicts.pop() if len(verdicts) == 1 and next(iter(verdicts)).endswith(("seed", "seeds")) else None

    def change(m: str) -> str:
        paper = "0" if line[f"{m}_paper_delta"] == 0 else metric_text(m, line[f"{m}_paper_delta"], signed=True)
        text = f"{SHORT[m]} {metric_text(m, line[f'{m}_delta'], signed=True)}/{paper}"
        return text if shared else f"{text} {line[f'{m}_agree']}"

    return " · ".join(change(m) for m in shown) + (f" ({shared})" if shared else "")


def narrow(table: pd.DataFrame) -> pd.DataFrame:
    """The Markdown table: row, its changes, then paper and ours side by side per metric, seeds, changes and verdicts."""
    base = table.loc["base"]
    records = []
    for name, line in table.iterrows():
        cells = {"row": name, "changes": "" if name == "base" else _changes_text(line, base)}
        for m in METRICS:
            cells[f"{SHORT[m]} paper"] = metric_text(m, line[f"{m}_paper"])
            cells[f"{SHORT[m]} ours"] = _ours_text(line, m)
        cells["seeds"] = str(line["seeds"])
        cells["Δ ours/paper, verdict"] = "" if name == "base" else _verdicts_text(line)
        records.append(cells)
    return pd.DataFrame(records)


MARKDOWN_LEGEND = (
    "changes: our configuration where it differs from our base row. params: ×10⁶. "
    "± after a value: sample standard deviation over seeds. Δ ours/paper: the change against the base "
    "row, ours then the paper's, then the verdict. The wide table with every configuration column and "
    "the standard errors of the changes is in the HTML, LaTeX and CSV versions beside this file."
)


def _trend(along: pd.DataFrame, row: str) -> str:
    """A row's change in dev PPL against base at a quarter, half, three quarters and all of training, with verdicts."""
    mine = along[along["row"] == row].set_index("step")
    if mine.empty:
        return ""
    last = mine.index.max()
    steps = sorted({min(mine.index, key=lambda s: abs(s - last * q)) for q in (0.25, 0.5, 0.75, 1.0)})
    shown = ", ".join(f"{mine.loc[s, 'change']:+.2f} ({mine.loc[s, 'agree']}) at step {s}" for s in steps)
    return f"; along training: {shown}"


def _missing_section(table: pd.DataFrame, summary: Summary, along: pd.DataFrame) -> list[str]:
    """Which of the paper's conclusions (a row's change against base) our runs do not show, what was measured, and
    for dev PPL how the change moved along training (`along`: progress.changes_by_step)."""
    if not any(t.judged for t in summary.tallies.values()):
        return [f"**Where the paper's conclusions do not appear.** No verdict yet: fewer than {MIN_SEEDS} seeds.", ""]
    missing = missing_conclusions(table)
    if not missing:
        return ["**Where the paper's conclusions do not appear.** Nowhere: every judged change agrees.", ""]
    return [
        "**Where the paper's conclusions do not appear** (our change against base, its standard error; for dev PPL,"
        " the change and its verdict along training):",
        "",
        *(f"- {line}{_trend(along, row) if metric == 'ppl' else ''}" for row, metric, line in missing),
        "",
    ]


def markdown(
    table: pd.DataFrame,
    header: list[tuple[str, str]],
    summary: Summary,
    note: str,
    title: str,
    headline: str,
    along: pd.DataFrame,
) -> str:
    lines = [
        f"# {title}",
        "",
        f"**{headline}**",
        "",
        *[f"- **{k}**: {v}" for k, v in header],
        "",
        f"**Summary.** {summary.line()}",
        "",
        narrow(table).to_markdown(index=False, disable_numparse=True),
        "",
        *_missing_section(table, summary, along),
        MARKDOWN_LEGEND,
        "",
        SIGNIFICANCE,
        "",
        "Paper values: Vaswani et al. (2017), Table 3.",
    ]
    if note:
        lines += ["", f"Runs that did not finish: {note}."]
    return "\n".join(lines) + "\n"


# --- HTML ------------------------------------------------------------------------------------------------------

CSS = stylesheet(
    "font-size: 13px; margin: 16px;",
    """h1 { font-size: 20px; margin: 0 0 12px; }
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
""",
)


def _group_rules(shown: pd.DataFrame) -> pd.DataFrame:
    """A rule above the first row of each group, like the paper's horizontal lines between (A), (B), ..."""
    groups = shown.index.get_level_values(0)
    first = [i == 0 or g != groups[i - 1] for i, g in enumerate(groups)]
    return pd.DataFrame(
        [["border-top: 1px solid #888" if f else ""] * shown.shape[1] for f in first],
        index=shown.index,
        columns=shown.columns,
    )


def page(
    shown: pd.DataFrame, header: list[tuple[str, str]], summary: Summary, note: str, title: str, headline: str
) -> str:
    agree = [c for c in shown.columns if c[1] == "agree"]
    styler = (
        shown.style.set_uuid("table3")  # a fixed id keeps the page identical across rebuilds of the same results
        .apply(_group_rules, axis=None)
        .map(lambda v: f"background-color: {AGREE_COLOR[v]}" if v in AGREE_COLOR else "", subset=agree)
        .format(escape="html")
        .format(
            lambda v: f'<span class="spill">{html.escape(v)}</span>' if v in PE_TEXT.values() else html.escape(v),
            subset=[("", "N")],
        )
        .set_table_attributes('class="table3"')
    )
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in header)
    unfinished = f'<p class="legend">Runs that did not finish: {html.escape(note)}.</p>' if note else ""
    return document(
        title,
        CSS,
        f'<h1>{html.escape(title)}</h1>\n<p class="summary">{html.escape(headline)}</p>\n'
        f'<dl class="header">{items}</dl>\n<p class="summary">{html.escape(summary.line())}</p>\n'
        f'{styler.to_html()}\n<p class="legend">{html.escape(LEGEND)}</p>\n{unfinished}',
    )


# --- LaTeX -----------------------------------------------------------------------------------------------------

LATEX_TEXT = {
    "±": "$\\pm$",
    "−": "$-$",
    "—": "---",
    "ε": "$\\epsilon$",
    "×": "$\\times$",
    "⁶": "$^6$",
    "ρ": "$\\rho$",
    "²": "$^2$",
    "&": "\\&",
    "%": "\\%",
    "_": "\\_",
    "#": "\\#",
}


def _latex_text(text: str) -> str:
    return "".join(LATEX_TEXT.get(ch, ch) for ch in str(text))


def latex(
    shown: pd.DataFrame, header: list[tuple[str, str]], summary: Summary, note: str, title: str, headline: str
) -> str:
    """A booktabs table laid out like the paper's: the configuration columns, then ours beside the paper's."""
    labels = {**{k: _latex_text(k) for k in set(shown.columns.get_level_values(0))}, **LATEX_LABEL}
    cells = shown.map(_latex_text).rename(columns=lambda c: labels.get(c, _latex_text(c)))
    caption = _latex_text(f"{title}. {headline} {summary.line()}")
    tex = cells.style.to_latex(
        hrules=True,
        multicol_align="c",
        multirow_align="naive",
        clines="skip-last;data",
        environment="table",
        position_float="centering",
        caption=caption,
        column_format="ll" + "r" * shown.shape[1],
    )
    tex = re.sub(r"\\cline\{[^}]*\}", r"\\midrule", tex)  # booktabs rules between the groups
    tex = tex.replace("\\midrule\n\\bottomrule", "\\bottomrule")  # none after the last group
    for text in PE_TEXT.values():  # row E's text spans the blank configuration columns, as in the paper
        span = len(PAPER_CONFIG)
        cell = f"\\multicolumn{{{span}}}{{l}}{{{text}}}"
        tex = re.sub(re.escape(text) + r"(?:\s*&){%d}" % (span - 1), lambda _, cell=cell: cell, tex)
    tex = tex.replace("\\begin{tabular}", "\\resizebox{\\linewidth}{!}{%\n\\begin{tabular}")
    tex = tex.replace("\\end{tabular}", "\\end{tabular}}")  # the table is wider than a page: scaled to the text width
    comments = [f"% {k}: {v}" for k, v in header] + ([f"% did not finish: {note}"] if note else [])
    return (
        "% Generated by `python -m reports` (needs \\usepackage{booktabs,graphicx}).\n"
        + "\n".join(comments)
        + "\n"
        + tex
    )


FORMATS = {"html": page, "tex": latex}


def write_all(results: BudgetResults, table: pd.DataFrame, summary: Summary, out_dir: Path) -> list[Path]:
    """Table 3 for one budget: narrow Markdown, wide HTML and LaTeX, the numbers behind it as CSV; returns the files."""
    title = f"Table 3 mirrored: budget {results.budget}" + (" (scaled)" if results.scaled else "")
    shown, header, note = display(table), provenance(results, table), unfinished_note(results.runs)
    line = headline(results, table, summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{results.budget}.md"
    along = changes_by_step(results.curves)
    write_atomic(md, markdown(table, header, summary, note, title, line, along))
    written = [md]
    for ext, render in FORMATS.items():
        path = out_dir / f"{results.budget}.{ext}"
        write_atomic(path, render(shown, header, summary, note, title, line))
        written.append(path)
    numbers = out_dir / f"{results.budget}.csv"
    write_atomic(numbers, table.to_csv())
    return [*written, numbers]
