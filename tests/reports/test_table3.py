"""Table 3 mirrored, the numbers: means and spreads over seeds, changes against base, their standard errors, the
verdicts under the 2-SE rule and the summary, on the fixed results of tests/reports/table3_fixture.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from model.table3 import table3_rows
from reports import table3, table3_text
from reports.inputs import load_budget
from tests.reports.table3_fixture import PAPER, SE, write_fixture, write_run


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
    by_row = {f"{row} {metric}": line for row, metric, line in missing}
    assert set(by_row) == {"C7 ppl", "E1 ppl", "A3 ppl", "E1 bleu"}  # two reversed changes, two within 2 SE
    assert "the opposite direction" in by_row["C7 ppl"] and "where the paper saw none" in by_row["E1 ppl"]
    assert "could not have shown it" in by_row["A3 ppl"]  # the paper's -0.01 is below 2 SE of three seeds
    assert by_row["C7 ppl"].startswith("C7: dev PPL") and f"SE {table.loc['C7', 'ppl_se']:.2f}" in by_row["C7 ppl"]


def test_a_change_the_seeds_could_have_shown_but_did_not_is_told_apart_from_one_below_their_resolution():
    lines = pd.DataFrame(
        {
            "ppl_agree": ["n.s.", "n.s."],
            "ppl_delta": [0.1, 0.1],
            "ppl_se": [0.2, 0.2],
            "ppl_paper_delta": [1.2, 0.3],  # beyond 2 SE (0.4) of ours; within it
            "bleu_agree": ["yes", "yes"],
            "bleu_delta": [0.0, 0.0],
            "bleu_se": [0.5, 0.5],
            "bleu_paper_delta": [0.0, 0.0],
        },
        index=["C1", "A2"],
    )
    (_, _, first), (_, _, second) = table3.missing_conclusions(lines)
    assert first.startswith("C1:") and "though a change the size of the paper's would have shown" in first
    assert second.startswith("A2:") and "could not have shown it" in second


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
