"""When the paper's conclusions appear: Table 3's verdicts at each evaluation step, from small fixed dev-PPL curves.

At step 100 (3 seeds each; base 100, 101, 102: mean 101, sd 1, so a change of two rows of 3 seeds has a standard
error sqrt(1/3 + 1/3) = 0.82 and counts beyond 1.63): A1 +10 agrees with the paper (worse), A2 +0.2 is n.s., C1 -10
disagrees (the paper: worse), E1 -0.2 agrees (the paper: no change), big has one seed (no verdict). At step 200 A2 and
C1 have turned the paper's way. At step 300 only base and A1 logged, one seed each: no verdict at all.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from reports import progress

CURVES = {  # row -> step -> dev PPL per seed
    "base": {100: [100.0, 101.0, 102.0], 200: [50.0, 51.0, 52.0], 300: [40.0]},
    "A1": {100: [110.0, 111.0, 112.0], 200: [60.0, 61.0, 62.0], 300: [45.0]},
    "A2": {100: [100.2, 101.2, 102.2], 200: [55.0, 56.0, 57.0]},
    "C1": {100: [90.0, 91.0, 92.0], 200: [70.0, 71.0, 72.0]},
    "E1": {100: [99.8, 100.8, 101.8], 200: [50.1, 51.1, 52.1]},
    "big": {100: [80.0], 200: [40.0]},
}


def curves(data: dict = CURVES) -> pd.DataFrame:
    """Curves as reports.inputs reads them, one line per logged step of each run, plus steps without a dev PPL."""
    lines = [
        {"row": row, "seed": seed, "step": step, "loss": 3.0, "dev_ppl": ppl}
        for row, steps in data.items()
        for step, values in steps.items()
        for seed, ppl in enumerate(values)
    ]
    lines.append({"row": "base", "seed": 0, "step": 50, "loss": 4.0, "dev_ppl": math.nan})  # logged, not evaluated
    lines.append({"row": "A1", "seed": 0, "step": 400, "loss": 2.0, "dev_ppl": 30.0})  # base not evaluated there
    return pd.DataFrame(lines)


@pytest.fixture(scope="module")
def by_step() -> pd.DataFrame:
    return progress.by_step(curves()).set_index(["step", "scope"])


def test_steps_are_those_where_base_was_evaluated(by_step):
    assert sorted(set(by_step.index.get_level_values("step"))) == [100, 200, 300]
    assert set(by_step.index.get_level_values("scope")) == {"all", "A", "B", "C", "D", "E"}


def test_agreement_share_counts_only_changes_beyond_two_standard_errors(by_step):
    step = by_step.loc[(100, "all")]
    # A1 agrees, A2 n.s., C1 disagrees, E1 agrees (no change, as the paper); big: one seed, no verdict
    assert (step["agree"], step["judged"], step["not_significant"], step["few_seeds"]) == (2, 4, 1, 1)
    assert step["share"] == pytest.approx(0.5)


def test_a_change_within_two_standard_errors_is_not_counted_as_agreeing(by_step):
    group_a = by_step.loc[(100, "A")]  # A1 +10 agrees; A2 +0.2 < 2 x 0.82 is not significant
    assert (group_a["agree"], group_a["judged"], group_a["not_significant"]) == (1, 2, 1)


def test_conclusions_appearing_later_raise_the_share(by_step):
    assert by_step.loc[(200, "all"), "share"] == pytest.approx(1.0)  # A1, A2, C1 worse as the paper; E1 unchanged
    assert by_step.loc[(100, "C"), "share"] == 0.0 and by_step.loc[(200, "C"), "share"] == 1.0


def test_one_seed_gives_no_share_only_the_seed_count(by_step):
    step = by_step.loc[(300, "all")]
    assert step["judged"] == 0 and math.isnan(step["share"]) and step["few_seeds"] == 1
    assert step["max_seeds"] == 1


def test_spearman_ranks_our_ppl_against_the_papers_across_rows(by_step):
    # step 100, means: big 80, C1 91, E1 100.8, base 101, A2 101.2, A1 111; the paper: big 4.33, base = E1 4.92,
    # A2 5.00, A1 5.29, C1 6.11 (ties get the average rank)
    ours, paper = [1, 2, 3, 4, 5, 6], [1, 6, 2.5, 2.5, 4, 5]
    assert by_step.loc[(100, "all"), "spearman_rows"] == 6
    assert by_step.loc[(100, "all"), "spearman"] == pytest.approx(np.corrcoef(ours, paper)[0, 1])
    assert by_step.loc[(100, "A"), "spearman"] == pytest.approx(1.0)  # base 101 < A2 101.2 < A1 111, as the paper
    assert math.isnan(by_step.loc[(100, "E"), "spearman"])  # base and E1: fewer than 3 rows


def test_groups_without_runs_are_marked_not_run(by_step):
    assert by_step.loc[(100, "B"), "rows"] == 0 and by_step.loc[(100, "B"), "judged"] == 0


def test_each_rows_change_against_base_is_followed_step_by_step_with_its_verdict_there():
    changes = progress.changes_by_step(curves()).set_index(["row", "step"])
    assert changes.loc[("C1", 100), "change"] == pytest.approx(-10.0)  # ahead of base early (the paper: C1 is worse)
    assert changes.loc[("C1", 100), "agree"] == "no" and changes.loc[("C1", 200), "agree"] == "yes"
    assert changes.loc[("C1", 200), "change"] == pytest.approx(20.0)
    assert changes.loc[("A1", 300), "agree"] == "1 seed"  # one seed logged there: no verdict
    assert 400 not in changes.index.get_level_values("step")  # base was not evaluated at 400


def test_markdown_table_has_one_line_per_step_and_a_cell_per_scope(tmp_path):
    table = progress.by_step(curves())
    md, csv = progress.write(table, tmp_path, "cpu", "When", "RULE")
    text = md.read_text()
    assert "| 100    | 2/4 · ρ " in text and "1 seed · ρ n/a" in text and "not run" in text and "RULE" in text
    assert pd.read_csv(csv).shape == (3 * 6, len(progress.COLUMNS))
