"""Table 3 mirrored: numbers and rendered formats, from a small fixed set of results written in the runner's format.

The fixture (two seeds for most rows) is chosen so that every verdict occurs: A1 agrees with the paper, A3 changes
less than its spread (n.s.), C7's PPL goes the other way (disagrees), D1 has one diverged seed, big has one seed,
and the other rows were not run.
"""
from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from model.table3 import paper_architecture_params, table3_rows
from reports import table3, table3_formats
from reports.inputs import load_budget

PAPER = {r.name: r for r in table3_rows()}
# (dev PPL, BLEU) per seed; None is a diverged run.
FIXTURE = {
    "base": [(10.0, 20.0), (10.2, 20.4)],
    "A1": [(11.0, 18.0), (11.2, 18.4)],
    "A3": [(10.05, 20.1), (10.25, 20.5)],
    "C7": [(11.0, 21.0), (11.4, 21.4)],
    "D1": [None, (12.0, 15.0)],
    "big": [(9.0, 22.0)],
}
SMOKE_VOCAB = 1000
STEPS = 40


def write_run(root: Path, row: str, seed: int, result: tuple[float, float] | None, budget: str = "smoke",
              date: str = "2026-11-22T10:{seed:02d}:00Z", config_hash: str = "{seed:08x}") -> Path:
    """One run folder in the results format: config.json, metrics.jsonl and final.json."""
    config = PAPER[row].config().replace(vocab_size=SMOKE_VOCAB)
    steps = STEPS * 3 if row == "big" else STEPS
    run = root / budget / "runs" / f"{row}-s{seed}-{config_hash.format(seed=seed)}"
    run.mkdir(parents=True)
    common = {"row": row, "group": PAPER[row].group, "seed": seed, "budget": budget, "preset": "tiny",
              "scaled": budget == "smoke", "model_spec": "reference"}
    (run / "config.json").write_text(json.dumps(common | {"config": config.to_dict(),
                                                           "train": {"steps": steps, "warmup": 10, "batch_tokens": 512},
                                                           "data": {"max_train_pairs": 4000, "dev_pairs": 100}}))
    ppl, bleu = (math.nan, math.nan) if result is None else result
    lines = [{"step": s, "loss": 5.0 - s / steps, "lr": 1e-3, "tokens_per_s": 1000.0 + seed, "time_s": s / 10}
             | ({"dev_ppl": ppl * (1 + (steps - s) / steps)} if s % 20 == 0 else {}) for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in lines) + "\n")
    final = common | {
        "status": "diverged" if result is None else "finished", "error": "loss is NaN" if result is None else None,
        "dev_ppl": None if result is None else ppl, "bleu": None if result is None else bleu,
        "bleu_tokenized": None if result is None else bleu + 0.5,
        "sacrebleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "params": paper_architecture_params(config), "steps": steps, "tokens_seen": steps * 512, "wall_s": steps / 10,
        "tokens_per_s": 1000.0 + seed, "mfu": None, "device": "cpu", "torch": "2.13.0", "commit": "abc1234",
        "date": date.format(seed=seed), "config": config.to_dict(),
    }
    (run / "final.json").write_text(json.dumps(final))
    return run


def write_fixture(root: Path, budget: str = "smoke") -> Path:
    for row, results in FIXTURE.items():
        for seed, result in enumerate(results):
            write_run(root, row, seed, result, budget)
    return root / budget


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return load_budget(write_fixture(tmp_path_factory.mktemp("results")))


@pytest.fixture(scope="module")
def table(results):
    return table3.compare(results.runs)


# --- the numbers ---------------------------------------------------------------------------------------------

def test_rows_are_the_papers_twenty_in_order(table):
    assert list(table.index) == [r.name for r in table3_rows()]


def test_paper_values_come_from_model_table3(table):
    for row in table3_rows():
        assert table.loc[row.name, "ppl_paper"] == row.paper_ppl
        assert table.loc[row.name, "bleu_paper"] == row.paper_bleu
        expected = math.nan if row.paper_params_millions is None else row.paper_params_millions
        assert table.loc[row.name, "params_paper"] == pytest.approx(expected, nan_ok=True)


def test_seeds_give_mean_and_sample_spread(table):
    assert table.loc["base", "seeds"] == 2
    assert table.loc["base", "ppl"] == pytest.approx(10.1)
    assert table.loc["base", "ppl_sd"] == pytest.approx(math.sqrt(0.02))  # sd of {10.0, 10.2}, ddof=1
    assert table.loc["big", "seeds"] == 1 and math.isnan(table.loc["big", "ppl_sd"])


def test_changes_are_against_the_base_row_for_us_and_for_the_paper(table):
    assert table.loc["A1", "ppl_delta"] == pytest.approx(1.0)
    assert table.loc["A1", "ppl_paper_delta"] == pytest.approx(PAPER["A1"].paper_ppl - PAPER["base"].paper_ppl)
    assert table.loc["A1", "bleu_delta"] == pytest.approx(-2.0)
    assert table.loc["B1", "params_paper_delta"] == pytest.approx(PAPER["B1"].paper_params_millions - 65)


def test_change_in_the_papers_direction_agrees(table):
    assert table.loc["A1", "ppl_agree"] == "yes" and table.loc["A1", "bleu_agree"] == "yes"
    assert table.loc["big", "ppl_agree"] == "yes"  # one seed: no spread, compared as measured


def test_change_against_the_papers_direction_disagrees(table):
    assert PAPER["C7"].paper_ppl < PAPER["base"].paper_ppl and table.loc["C7", "ppl_delta"] > 0
    assert table.loc["C7", "ppl_agree"] == "no"
    assert table.loc["C7", "bleu_agree"] == "yes"


def test_change_smaller_than_its_spread_is_not_significant(table):
    assert abs(table.loc["A3", "ppl_delta"]) < table.loc["A3", "ppl_spread"] == pytest.approx(0.2)
    assert table.loc["A3", "ppl_agree"] == "n.s." and table.loc["A3", "bleu_agree"] == "n.s."


def test_diverged_seed_is_left_out_of_the_mean_and_counted(table):
    assert table.loc["D1", "seeds"] == 1 and table.loc["D1", "not_finished"] == 1
    assert table.loc["D1", "ppl"] == pytest.approx(12.0)
    assert table.loc["D1", "ppl_spread"] == pytest.approx(table.loc["base", "ppl_sd"])  # only base's spread is known


def test_an_older_run_of_the_same_row_and_seed_is_superseded_and_named(tmp_path):
    folder = write_fixture(tmp_path)
    write_run(tmp_path, "base", 0, (99.0, 1.0), date="2026-11-21T09:00:00Z", config_hash="0ldc0nf1")
    results = load_budget(folder)
    assert results.superseded == ["base-s0-0ldc0nf1"]
    assert table3.compare(results.runs).loc["base", "ppl"] == pytest.approx(10.1)  # the newer runs only
    header = dict(table3_formats.provenance(results, table3.compare(results.runs)))
    assert "base-s0-0ldc0nf1" in header["results"]


def test_rows_not_run_have_no_metrics_and_no_verdict(table):
    assert table.loc["B1", "seeds"] == 0 and math.isnan(table.loc["B1", "ppl"])
    assert table.loc["B1", "ppl_agree"] == "—" and table.loc["base", "ppl_agree"] == "—"


@pytest.mark.parametrize(("ours", "spread", "paper", "verdict"), [
    (1.0, 0.2, 0.5, "yes"), (-1.0, 0.2, 0.5, "no"), (0.1, 0.2, -0.5, "n.s."), (0.1, math.nan, -0.5, "no"),
    (math.nan, 0.2, 0.5, "—"), (1.0, 0.2, math.nan, "—"), (0.0, 0.0, -0.5, "n.s."), (0.0, math.nan, 0.5, "n.s."),
    (0.3, math.nan, 0.0, "no"),
])
def test_direction_agreement(ours, spread, paper, verdict):
    assert table3.direction_agreement(ours, spread, paper) == verdict


def test_summary_counts_directions_and_ranks_ppl(table):
    summary = table3.summarize(table)
    assert summary.agree == {"ppl": 3, "bleu": 4} and summary.compared == {"ppl": 4, "bleu": 4}
    assert summary.not_significant == {"ppl": 1, "bleu": 1}
    # ranks of ours (big, base, A3, A1, C7, D1) against the paper's (big, C7, A3, base, A1, D1): sum d^2 = 14
    assert summary.spearman_rows == 6 and summary.spearman_ppl == pytest.approx(1 - 6 * 14 / (6 * 35))
    assert "PPL 3 of 4 rows (n.s.: 1)" in summary.line() and "0.60" in summary.line()


# --- the rendered formats ----------------------------------------------------------------------------------------

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


def test_markdown_has_the_papers_rows_and_columns_with_ours_beside(rendered):
    rows = markdown_rows(rendered["md"])
    assert [r["row"] for r in rows] == [r.name for r in table3_rows()]
    for metric in ("PPL (dev)", "BLEU (dev)", "params ×10⁶"):
        assert all(f"{metric} {part}" in rows[0] for part in ("ours", "paper", "Δ ours", "Δ paper", "agree"))
    assert list(rows[0])[2:11] == PAPER_COLUMNS


def test_markdown_blanks_values_equal_to_base_as_the_paper_prints_them(rendered):
    rows = {r["row"]: r for r in markdown_rows(rendered["md"])}
    assert [rows["base"][c] for c in PAPER_COLUMNS[:8]] == ["6", "512", "2048", "8", "64", "64", "0.1", "0.1"]
    assert [rows["A1"][c] for c in PAPER_COLUMNS] == ["", "", "", "1", "512", "512", "", "", ""]
    assert rows["big"]["d_model"] == "1024" and rows["big"]["train steps"] == str(STEPS * 3)
    assert rows["E1"]["N"] == "positional embedding instead of sinusoids"


def test_markdown_shows_paper_values_changes_and_verdicts(rendered):
    rows = {r["row"]: r for r in markdown_rows(rendered["md"])}
    assert rows["A1"]["PPL (dev) paper"] == f"{PAPER['A1'].paper_ppl:.2f}"
    assert rows["A1"]["PPL (dev) ours"] == "11.10 ± 0.14"
    assert rows["A1"]["PPL (dev) Δ ours"] == "+1.00 ± 0.20"
    assert rows["A1"]["PPL (dev) Δ paper"] == f"+{PAPER['A1'].paper_ppl - PAPER['base'].paper_ppl:.2f}"
    assert rows["A1"]["params ×10⁶ paper"] == ""  # the paper prints no params for row A
    base_params = paper_architecture_params(PAPER["base"].config().replace(vocab_size=SMOKE_VOCAB)) / 1e6
    assert rows["base"]["params ×10⁶ ours"] == f"{base_params:.3g}"  # millions to 3 significant digits
    assert rows["B1"]["params ×10⁶ paper"] == f"{PAPER['B1'].paper_params_millions:.0f}"
    assert (rows["A1"]["PPL (dev) agree"], rows["C7"]["PPL (dev) agree"], rows["A3"]["PPL (dev) agree"]) == ("yes", "no", "n.s.")
    assert rows["B1"]["PPL (dev) ours"] == "not run" and rows["D1"]["seeds"] == "1"


def test_markdown_header_says_what_produced_it(rendered):
    text = rendered["md"]
    assert text.startswith("# Table 3 mirrored: budget smoke (scaled)")
    for fact in ("**budget**: smoke (scaled", "**device**: cpu", "**torch**: 2.13.0", "**commit**: abc1234",
                 "**data**: preset tiny, max_train_pairs=4000, dev_pairs=100", "**tokens seen**: base 20,480", "tok:13a", "**steps**: base 40"):
        assert fact in text
    assert "PPL 3 of 4 rows (n.s.: 1)" in text
    assert "D1 seed 0: diverged (loss is NaN)" in text


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
    assert "11.10 $\\pm$ 0.14" in tex and "$d_\\text{model}$" in tex


def test_csv_holds_the_numbers_behind_the_table(rendered):
    numbers = pd.read_csv(pd.io.common.StringIO(rendered["csv"]), index_col="row")
    assert numbers.loc["A1", "ppl_delta"] == pytest.approx(1.0) and numbers.loc["C7", "ppl_agree"] == "no"
