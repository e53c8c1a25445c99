"""Table 3 mirrored, the rendered formats: narrow Markdown, a standalone HTML page, LaTeX booktabs and the CSV, their
header and headline, on the fixed results of tests/reports/table3_fixture.py."""

from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser

import pandas as pd
import pytest

from ablations.grid.health import Baseline
from model.table3 import paper_architecture_params, table3_rows
from reports import table3, table3_formats, table3_text
from tests.reports.table3_fixture import PAPER, SE, SMOKE_VOCAB, STEPS

PAPER_COLUMNS = ["N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls", "train steps"]


@pytest.fixture(scope="module")
def rendered(results, table, tmp_path_factory):
    out = tmp_path_factory.mktemp("table3")
    table3_formats.write_all(results, table, table3.summarize(table), out)
    return {ext: (out / f"smoke.{ext}").read_text() for ext in ("md", "html", "tex", "csv")}


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The Markdown table as one dict per row, keyed by the header's cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


MARKDOWN_COLUMNS = [
    "row",
    "changes",
    "PPL paper",
    "PPL ours",
    "BLEU paper",
    "BLEU ours",
    "params paper",
    "params ours",
    "seeds",
    "Δ ours/paper, verdict",
]


def test_markdown_is_narrow_with_the_papers_values_beside_ours(rendered):
    rows = markdown_rows(rendered["md"])
    assert [r["row"] for r in rows] == [r.name for r in table3_rows()]
    assert list(rows[0]) == MARKDOWN_COLUMNS


def test_markdown_names_each_rows_changes_to_base(rendered):
    rows = {r["row"]: r for r in markdown_rows(rendered["md"])}
    assert rows["base"]["changes"] == ""
    assert rows["A1"]["changes"] == "h=1, d_k=512, d_v=512"
    assert rows["big"]["changes"] == f"d_model=1024, d_ff=4096, h=16, P_drop=0.3, steps={STEPS * 3}"
    assert rows["E1"]["changes"] == "pe=learned"
    assert "**base configuration**: N=6, d_model=512, d_ff=2048, h=8, d_k=64, d_v=64" in rendered["md"]


def test_markdown_shows_paper_values_changes_and_verdicts(rendered):
    rows = {r["row"]: r for r in markdown_rows(rendered["md"])}
    assert rows["A1"]["PPL paper"] == f"{PAPER['A1'].paper_ppl:.2f}" and rows["A1"]["PPL ours"] == "11.20 ± 0.20"
    paper_change = PAPER["A1"].paper_ppl - PAPER["base"].paper_ppl
    assert rows["A1"]["Δ ours/paper, verdict"] == f"PPL +1.00/+{paper_change:.2f} yes · BLEU −2.0/−0.9 yes"
    assert rows["A3"]["Δ ours/paper, verdict"] == "PPL +0.10/−0.01 n.s. · BLEU +0.1/0 yes"  # 0: no change expected
    assert (
        rows["D1"]["Δ ours/paper, verdict"].endswith("(2 seeds)") and " yes" not in rows["D1"]["Δ ours/paper, verdict"]
    )
    assert rows["A1"]["params paper"] == ""  # the paper prints no params for row A
    base_params = paper_architecture_params(PAPER["base"].config().replace(vocab_size=SMOKE_VOCAB)) / 1e6
    assert rows["base"]["params ours"] == f"{base_params:.3g}"  # millions to 3 significant digits
    assert rows["B1"]["params paper"] == f"{PAPER['B1'].paper_params_millions:.0f}"
    assert rows["B1"]["PPL ours"] == "not run" and rows["D1"]["seeds"] == "2"


def test_wide_table_blanks_configuration_equal_to_base_as_the_paper_prints_it(table):
    shown = table3_formats.display(table).droplevel(0)
    config = shown[[("", c) for c in PAPER_COLUMNS]]
    assert list(config.loc["base"])[:8] == ["6", "512", "2048", "8", "64", "64", "0.1", "0.1"]
    assert list(config.loc["A1"]) == ["", "", "", "1", "512", "512", "", "", ""]
    assert config.loc["big", ("", "d_model")] == "1024" and config.loc["big", ("", "train steps")] == str(STEPS * 3)
    assert config.loc["E1", ("", "N")] == "positional embedding instead of sinusoids"
    assert shown.loc["A1", ("PPL (dev)", "Δ ours")] == f"+1.00 ± {SE:.2f}"  # the change ± its standard error


def test_wide_table_gives_each_rows_median_training_throughput_and_share_of_the_gemm_rate(table):
    shown = table3_formats.display(table).droplevel(0)
    assert shown.loc["base", ("training", "tok/s")] == "1,001"  # seeds 0, 1, 2: 1000, 1001, 1002 tokens/s
    assert shown.loc["base", ("training", "GEMM share")] == "26%"
    assert (
        shown.loc["big", ("training", "tok/s")] == "1,000" and shown.loc["B1", ("training", "tok/s")] == ""
    )  # B1 not run


def test_markdown_header_says_what_produced_it(rendered):
    text = rendered["md"]
    assert text.startswith("# Table 3 mirrored: budget smoke (scaled)")
    for fact in (
        "**budget**: smoke (scaled",
        "**device**: cpu",
        "**torch**: 2.13.0",
        "**commit**: abc1234",
        "**data**: preset tiny, max_train_pairs=4000, dev_pairs=100",
        "**tokens seen**: base 20,480",
        "tok:13a",
        "**steps**: base 40",
        "**throughput**: base 1,001 source+target tokens/s in training, 26% of the machine's measured GEMM rate",
    ):
        assert fact in text
    assert "PPL 1 of 4 rows agree (25%; n.s. 1, 2 with fewer than 3 seeds)" in text
    assert "2 × sqrt(sd_row²/n_row + sd_base²/n_base)" in text  # the rule is stated
    assert "D1 seed 0: diverged (loss is NaN)" in text
    assert "**learning**: not judged: no readable baseline.json" in text  # the fixture publishes none


def test_header_counts_the_runs_that_left_the_plateau_and_names_each_on_it_or_collapsed(results, table):
    # Finished runs' dev PPL: 9.0 to 12.2. Plateau above 11.3 (half of 22.6), collapsed above 12 (the vocabulary).
    judged = dataclasses.replace(results, baseline=Baseline(unigram_ppl=22.6, vocab=12, dev_pairs=100))
    text = table3_text.learning_text(judged, list(table.index))
    assert text.startswith(
        "12 of 18 finished runs left the unigram plateau (dev PPL 9.0 to 11.2); on it: A1 seed 2 (11), C7 seed 0 (11), "
        "C7 seed 1 (12), C7 seed 2 (12), D1 seed 1 (12); collapsed: D1 seed 2 (12) (plateau: dev PPL above 11, half "
        "the unigram PPL of 23 on 100 dev pairs; collapsed: above 12,"
    ), text


def test_a_dev_ppl_conclusion_that_does_not_appear_shows_its_change_along_training(rendered):
    # The fixture logs dev PPL at steps 20 and 40, at 1.5 times the final value at step 20.
    assert (
        "- C7: dev PPL +1.40 (SE 0.16) against the paper's -0.17: the opposite direction, beyond 2 SE; "
        "along training: +2.10 (no) at step 20, +1.40 (no) at step 40\n"
    ) in rendered["md"]
    assert "- E1: BLEU +0.00 (SE 0.33) against the paper's -0.10: within 2 SE of none;" in rendered["md"]
    assert "at step" not in next(line for line in rendered["md"].splitlines() if line.startswith("- E1: BLEU"))


def test_headline_states_sizes_data_steps_seeds_base_bleu_agreement_and_spearman(results, table):
    line = table3_text.headline(results, table, table3.summarize(table))
    rho = table3.summarize(table).spearman_ppl
    for fact in (
        "the paper's sizes",
        "tiny",
        "first 4000 training pairs",
        "not the paper's WMT 2014",
        "40 steps (base)",
        "1 to 3 seeds per row",
        "Base dev BLEU 20.4 ± 0.4",
        "25% (1 of 4 judged rows)",
        f"{rho:.2f} over 7 rows",
    ):
        assert fact in line, fact


class _Cells(HTMLParser):
    """Rows of a rendered HTML table body as lists of cell texts."""

    def __init__(self):
        super().__init__()
        self.rows, self.in_body, self.cell = [], False, None

    def handle_starttag(self, tag, attrs):
        self.in_body |= tag == "tbody"
        if self.in_body and tag == "tr":
            self.rows.append([])
        if self.in_body and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_html_is_a_standalone_page_with_every_row(rendered):
    page = rendered["html"]
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page and page.rstrip().endswith("</html>")
    parser = _Cells()
    parser.feed(page)
    assert len(parser.rows) == len(table3_rows())
    c7 = next(r for r in parser.rows if "C7" in r)
    assert "4096" in c7 and "no" in c7 and f"{PAPER['C7'].paper_ppl:.2f}" in c7
    assert "background-color: #f6d5d5" in page  # the disagreeing cell is shaded


def test_latex_is_a_booktabs_table_grouped_like_the_paper(rendered):
    tex = rendered["tex"]
    assert all(rule in tex for rule in ("\\toprule", "\\midrule", "\\bottomrule"))
    assert "\\cline" not in tex and "±" not in tex and "−" not in tex  # only LaTeX-safe text
    body = tex.split("\\midrule", 1)[1].split("\\bottomrule")[0]
    assert len(re.findall(r"\\\\\s*$", body, flags=re.M)) == len(table3_rows())
    assert tex.count("\\midrule") == 1 + 6  # below the header, then between base, (A)..(E), big
    assert "11.20 $\\pm$ 0.20" in tex and "$d_\\text{model}$" in tex
    assert not re.search(r"[^\x00-\x7f]", tex.split("\n", 1)[1].split("\\begin{table}")[1])  # ASCII only: LaTeX-safe


def test_csv_holds_the_numbers_behind_the_table(rendered):
    numbers = pd.read_csv(pd.io.common.StringIO(rendered["csv"]), index_col="row")
    assert numbers.loc["A1", "ppl_delta"] == pytest.approx(1.0) and numbers.loc["C7", "ppl_agree"] == "no"
