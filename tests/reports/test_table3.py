"""Table 3 mirrored: numbers and rendered formats, from a small fixed set of results written in the runner's format.

The fixture (three seeds for most rows) is chosen so that every verdict occurs: A1 agrees with the paper, A3's PPL
changes by less than two standard errors (n.s.), C7's PPL goes the other way (disagrees), E1 (the paper: no change in
PPL) changes PPL significantly (disagrees), A3's BLEU (the paper: no change) stays within its errors (agrees), D1 has one diverged seed of three (2 seeds:
no verdict), big has one seed (no verdict), and the other rows were not run.
"""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from model.table3 import paper_architecture_params, table3_rows
from reports import table3, table3_formats, table3_text
from reports.inputs import load_budget

PAPER = {r.name: r for r in table3_rows()}
# (dev PPL, BLEU) per seed; None is a diverged run.
FIXTURE = {
    "base": [(10.0, 20.0), (10.2, 20.4), (10.4, 20.8)],
    "A1": [(11.0, 18.0), (11.2, 18.4), (11.4, 18.8)],
    "A3": [(10.1, 20.1), (10.3, 20.5), (10.5, 20.9)],
    "C7": [(11.4, 21.0), (11.6, 21.4), (11.8, 21.8)],
    "D1": [None, (12.0, 15.0), (12.2, 15.4)],
    "E1": [(10.8, 20.0), (11.0, 20.4), (11.2, 20.8)],
    "big": [(9.0, 22.0)],
}
SE = math.sqrt(0.04 / 3 + 0.04 / 3)  # standard error of a change between two rows of 3 seeds with sd 0.2 each
SMOKE_VOCAB = 1000
STEPS = 40


def write_run(
    root: Path,
    row: str,
    seed: int,
    result: tuple[float, float] | None,
    budget: str = "smoke",
    date: str = "2026-11-22T10:{seed:02d}:00Z",
    config_hash: str = "{seed:08x}",
) -> Path:
    """One run folder in the results format: config.json, metrics.jsonl and final.json."""
    config = PAPER[row].config().replace(vocab_size=SMOKE_VOCAB)
    steps = STEPS * 3 if row == "big" else STEPS
    run = root / budget / "runs" / f"{row}-s{seed}-{config_hash.format(seed=seed)}"
    run.mkdir(parents=True)
    common = {
        "row": row,
        "group": PAPER[row].group,
        "seed": seed,
        "budget": budget,
        "preset": "tiny",
        "scaled": budget == "smoke",
        "model_spec": "reference",
    }
    (run / "config.json").write_text(
        json.dumps(
            common
            | {
                "config": config.to_dict(),
                "train": {"steps": steps, "warmup": 10, "batch_tokens": 512},
                "data": {"max_train_pairs": 4000, "dev_pairs": 100},
            }
        )
    )
    ppl, bleu = (math.nan, math.nan) if result is None else result
    lines = [
        {"step": s, "loss": 5.0 - s / steps, "lr": 1e-3, "tokens_per_s": 1000.0 + seed, "time_s": s / 10}
        | ({"dev_ppl": ppl * (1 + (steps - s) / steps)} if s % 20 == 0 else {})
        for s in range(1, steps + 1)
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in lines) + "\n")
    final = common | {
        "status": "diverged" if result is None else "finished",
        "error": "loss is NaN" if result is None else None,
        "dev_ppl": None if result is None else ppl,
        "bleu": None if result is None else bleu,
        "bleu_tokenized": None if result is None else bleu + 0.5,
        "sacrebleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "params": paper_architecture_params(config),
        "steps": steps,
        "tokens_seen": steps * 512,
        "wall_s": steps / 10,
        "tokens_per_s": 1000.0 + seed,
        "gemm_fraction": 0.25 + seed / 100,
        "mfu": None,
        "device": "cpu",
        "torch": "2.13.0",
        "commit": "abc1234",
        "date": date.format(seed=seed),
        "config": config.to_dict(),
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
    assert table.loc["base", "seeds"] == 3
    assert table.loc["base", "ppl"] == pytest.approx(10.2)
    assert table.loc["base", "ppl_sd"] == pytest.approx(0.2)  # sd of {10.0, 10.2, 10.4}, ddof=1
    assert table.loc["big", "seeds"] == 1 and math.isnan(table.loc["big", "ppl_sd"])


def test_changes_are_against_the_base_row_for_us_and_for_the_paper(table):
    assert table.loc["A1", "ppl_delta"] == pytest.approx(1.0)
    assert table.loc["A1", "ppl_paper_delta"] == pytest.approx(PAPER["A1"].paper_ppl - PAPER["base"].paper_ppl)
    assert table.loc["A1", "bleu_delta"] == pytest.approx(-2.0)
    assert table.loc["B1", "params_paper_delta"] == pytest.approx(PAPER["B1"].paper_params_millions - 65)


def test_a_change_has_the_standard_error_of_a_difference_of_means(table):
    assert table.loc["A1", "ppl_se"] == pytest.approx(SE)  # sqrt(sd_row²/n_row + sd_base²/n_base)
    assert math.isnan(table.loc["big", "ppl_se"])  # one seed: no spread, no standard error


def test_change_beyond_two_standard_errors_in_the_papers_direction_agrees(table):
    assert table.loc["A1", "ppl_delta"] > 2 * SE and table.loc["A1", "ppl_agree"] == "yes"
    assert table.loc["A1", "bleu_agree"] == "yes"


def test_change_beyond_two_standard_errors_against_the_papers_direction_disagrees(table):
    assert PAPER["C7"].paper_ppl < PAPER["base"].paper_ppl and table.loc["C7", "ppl_delta"] > 2 * SE
    assert table.loc["C7", "ppl_agree"] == "no"
    assert table.loc["C7", "bleu_agree"] == "yes"


def test_change_within_two_standard_errors_is_not_significant(table):
    assert abs(table.loc["A3", "ppl_delta"]) < 2 * table.loc["A3", "ppl_se"]
    assert table.loc["A3", "ppl_agree"] == "n.s."


def test_where_the_paper_saw_no_change_none_of_ours_agrees_and_a_significant_one_disagrees(table):
    assert PAPER["E1"].paper_ppl == PAPER["base"].paper_ppl and PAPER["A3"].paper_bleu == PAPER["base"].paper_bleu
    assert table.loc["E1", "ppl_delta"] > 2 * SE and table.loc["E1", "ppl_agree"] == "no"
    assert table.loc["A3", "bleu_agree"] == "yes"  # +0.1 BLEU within its standard errors: no change, as the paper


def test_the_report_names_each_conclusion_that_does_not_appear_with_what_was_measured(table):
    missing = table3.missing_conclusions(table)
    by_row = {line.split(":")[0] + " " + line.split(" ")[1]: line for line in missing}
    assert set(by_row) == {"C7 dev", "E1 dev", "A3 dev", "E1 BLEU"}  # two reversed changes, two within 2 SE
    assert "the opposite direction" in by_row["C7 dev"] and "where the paper saw none" in by_row["E1 dev"]
    assert "could not have shown it" in by_row["A3 dev"]  # the paper's -0.01 is below 2 SE of three seeds
    assert f"SE {table.loc['C7', 'ppl_se']:.2f}" in by_row["C7 dev"]


def test_fewer_than_three_seeds_give_no_verdict_only_their_count(table):
    assert table.loc["big", "ppl_agree"] == "1 seed" and table.loc["big", "bleu_agree"] == "1 seed"
    assert table.loc["D1", "ppl_agree"] == "2 seeds"  # large change, but one of three seeds diverged


def test_diverged_seed_is_left_out_of_the_mean_and_counted(table):
    assert table.loc["D1", "seeds"] == 2 and table.loc["D1", "not_finished"] == 1
    assert table.loc["D1", "ppl"] == pytest.approx(12.1)


def test_parameter_counts_are_compared_as_counted_whatever_the_seeds(table):
    assert table.loc["big", "params_agree"] == "yes"  # one seed, but a count has no noise


def test_an_older_run_of_the_same_row_and_seed_is_superseded_and_named(tmp_path):
    folder = write_fixture(tmp_path)
    write_run(tmp_path, "base", 0, (99.0, 1.0), date="2026-11-21T09:00:00Z", config_hash="0ldc0nf1")
    results = load_budget(folder)
    assert results.superseded == ["base-s0-0ldc0nf1"]
    assert table3.compare(results.runs).loc["base", "ppl"] == pytest.approx(10.2)  # the newer runs only
    header = dict(table3_text.provenance(results, table3.compare(results.runs)))
    assert "base-s0-0ldc0nf1" in header["results"]


def test_rows_not_run_have_no_metrics_and_no_verdict(table):
    assert table.loc["B1", "seeds"] == 0 and math.isnan(table.loc["B1", "ppl"])
    assert table.loc["B1", "ppl_agree"] == "—" and table.loc["base", "ppl_agree"] == "—"


@pytest.mark.parametrize(
    ("ours", "se", "paper", "seeds", "expected"),
    [
        (1.0, 0.2, 0.5, 3, "yes"),
        (-1.0, 0.2, 0.5, 3, "no"),
        (0.3, 0.2, -0.5, 3, "n.s."),
        (0.4, 0.2, -0.5, 3, "n.s."),
        (0.41, 0.2, -0.5, 3, "no"),
        (1.0, math.nan, 0.5, 1, "1 seed"),
        (1.0, 0.2, 0.5, 2, "2 seeds"),
        (math.nan, 0.2, 0.5, 3, "—"),
        (1.0, 0.2, math.nan, 3, "—"),
        (0.0, 0.0, -0.5, 3, "n.s."),
        (0.3, 0.2, 0.0, 3, "yes"),
        (0.5, 0.2, 0.0, 3, "no"),
        (0.5, math.nan, 0.0, 1, "1 seed"),
    ],
)
def test_verdict_under_the_two_standard_error_rule(ours, se, paper, seeds, expected):
    assert table3.verdict(ours, se, paper, seeds) == expected


def test_summary_tallies_verdicts_and_ranks_ppl(table):
    summary = table3.summarize(table)
    ppl, bleu = summary.tallies["ppl"], summary.tallies["bleu"]
    assert (ppl.agree, ppl.judged, ppl.not_significant, ppl.few_seeds) == (1, 4, 1, 2)  # A1 | A3 n.s., C7, E1 no
    assert (bleu.agree, bleu.judged, bleu.few_seeds) == (3, 4, 2)  # A1, A3 (no change, as the paper), C7 | E1 n.s.
    # Spearman = Pearson of ranks (ties averaged): ours big, base, A3, E1, A1, C7, D1; the paper's with base = E1
    ours_rank, paper_rank = [1, 2, 3, 4, 5, 6, 7], [1, 4.5, 3, 4.5, 6, 2, 7]
    assert summary.spearman_rows == 7
    assert summary.spearman_ppl == pytest.approx(np.corrcoef(ours_rank, paper_rank)[0, 1])
    assert "PPL 1 of 4 rows agree (25%; n.s. 1, 2 with fewer than 3 seeds)" in summary.line()


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
