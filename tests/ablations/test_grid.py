"""The smoke grid end to end on real Multi30k data: all 20 Table 3 rows train, score and record; runs resume exactly.

The grid runs once per session (module fixture). Sizes are the paper's divided by 8, so the numbers show that the
machinery works, not what the rows are worth. The fixture's grid is the smoke budget's with half its 24 steps (as
`--steps 12` gives: it still logs, evaluates, checkpoints twice and resumes) and each row scored on the first
DEV_PAIRS of its 100 dev pairs; the identities the smoke budget gives its runs are checked without training them.
"""

import dataclasses

import pytest
import torch

from ablations.grid.runner import Grid, plan_run, prepare_data, run_grid, run_one
from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS
from ablations.training.checkpoints import read_checkpoint
from model import ModelSpec
from model.table3 import table3_rows
from tests.ablations.test_run_identity import SMOKE as SMOKE_IDENTITIES
from tests.ablations.test_run_identity import SMOKE_BPE
from tests.helpers import DEV_PAIRS, REAL_DATA, needs_data

pytestmark = [pytest.mark.slow, needs_data]
SMOKE = BUDGETS["smoke"]
STEPS = 12  # checkpoints at 8 and 12, dev perplexity at 12 (the smoke budget's eval_every)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    full = prepare_data(SMOKE, "multi30k", REAL_DATA, runs)
    assert len(full.dev_src) == SMOKE.dev_pairs
    data = dataclasses.replace(
        full, dev_src=full.dev_src[:DEV_PAIRS], dev_tgt=full.dev_tgt[:DEV_PAIRS], dev_refs=full.dev_refs[:DEV_PAIRS]
    )
    grid = Grid(SMOKE.replace(steps=STEPS), table3_rows(), [1], ModelSpec("reference"), runs, torch.device("cpu"))
    outcomes = run_grid(grid, data)
    finals = {R.read_json(d / R.FINAL)["row"]: R.read_json(d / R.FINAL) for d, _ in outcomes}
    return grid, data, outcomes, finals


def test_every_row_finishes_with_finite_perplexity_and_bleu(smoke):
    _, data, outcomes, finals = smoke
    assert [s for _, s in outcomes] == ["finished"] * 20
    assert list(finals) == [r.name for r in table3_rows()]
    vocab = data.sp.get_piece_size()
    for row, final in finals.items():
        assert final["scaled"] is True and final["budget"] == "smoke"
        assert final["bleu"] is not None and 0.0 <= final["bleu"] <= 100.0, row
        assert final["bleu_tokenized"] is not None and "tok:13a" in final["sacrebleu_signature"], row
        # Better than guessing uniformly over the vocabulary: every row did learn something in 12 steps.
        assert final["dev_ppl"] is not None and 1.0 < final["dev_ppl"] < vocab, row
        assert final["steps"] == STEPS and final["tokens_seen"] > 0


def test_each_run_keeps_the_folder_the_code_before_the_run_folder_refactor_gave_it(smoke):
    grid, data, outcomes, _ = smoke
    assert data.bpe_key == SMOKE_BPE  # the committed smoke grid's: the same data, the same BPE
    smoke_grid = dataclasses.replace(grid, budget=SMOKE)  # the full smoke budget, planned on the real data
    planned = [plan_run(smoke_grid, row, 1, data).directory for row in grid.rows]
    assert [d.name for d in planned] == [f"{row}-s1-{key}" for row, key in SMOKE_IDENTITIES.items()]
    # The grid trains and records each run in the folder plan_run names, which its written config hashes to.
    assert [d for d, _ in outcomes] == [plan_run(grid, row, 1, data).directory for row in grid.rows]
    assert all(R.config_hash(R.read_config(d)) == d.name.rpartition("-")[2] for d, _ in outcomes)


def test_parameter_counts_differ_between_rows_as_the_table_says(smoke):
    """Rows with a printed count: the same sign of difference from base as the paper's. Rows A and D change
    heads or regularisation only, so they keep base's count; E adds a learned max_len x d_model table."""
    finals = smoke[3]
    rows = {r.name: r for r in table3_rows()}
    base = finals["base"]["params"]
    for name, final in finals.items():
        row = rows[name]
        if row.paper_params_millions is not None:
            paper_sign = (row.paper_params_millions > 65) - (row.paper_params_millions < 65)
            ours = (final["params"] > base) - (final["params"] < base)
            assert ours == paper_sign, name
        elif row.group in ("A", "D"):
            assert final["params"] == base, name
    cfg = finals["E1"]["config"]
    assert finals["E1"]["params"] == base + cfg["max_len"] * cfg["d_model"]


def test_results_table_has_one_row_per_run_with_the_config_flattened(smoke):
    grid = smoke[0]
    table = R.results_table(grid.runs)
    assert len(table) == 20 and set(table["row"]) == {r.name for r in table3_rows()}
    for column in (
        "N",
        "d_model",
        "d_ff",
        "h",
        "d_k",
        "d_v",
        "P_drop",
        "eps_ls",
        "pe",
        "dev_ppl",
        "bleu",
        "params",
        "status",
    ):
        assert column in table.columns
    assert table.set_index("row").loc["C5", "d_model"] == 1024 // 8


def test_running_the_grid_again_skips_every_finished_run(smoke):
    grid, data, outcomes, _ = smoke
    before = {d: (d / R.FINAL).read_bytes() for d, _ in outcomes}
    again = run_grid(grid, data)
    assert again == outcomes
    assert before == {d: (d / R.FINAL).read_bytes() for d, _ in outcomes}


class Interrupt(KeyboardInterrupt):
    pass


def test_an_interrupted_run_resumed_from_its_checkpoint_ends_exactly_as_the_uninterrupted_one(smoke, tmp_path):
    grid, data, outcomes, finals = smoke
    fresh = Grid(grid.budget, grid.rows, grid.seeds, grid.model_spec, tmp_path, grid.device)
    base = table3_rows()[0]

    def stop_at_10(step: int) -> None:
        if step == 10:  # between checkpoints (every 8 steps, and the last): steps 9 and 10 are lost and redone
            raise Interrupt

    with pytest.raises(Interrupt):
        run_one(fresh, base, 1, data, on_step=stop_at_10)
    directory = next((tmp_path / "smoke").iterdir())
    assert R.status(directory) == "partial"
    assert read_checkpoint(directory / R.CHECKPOINT)["state"]["step"] == 8
    assert run_one(fresh, base, 1, data) == (directory, "finished")

    resumed, uninterrupted = R.read_json(directory / R.FINAL), finals["base"]
    for key in ("dev_ppl", "bleu", "bleu_tokenized", "steps", "tokens_seen", "params"):
        assert resumed[key] == uninterrupted[key], key  # exact: CPU float32 with the same thread count is deterministic
    logged = lambda d: [(r["step"], r["loss"], r["lr"], r.get("dev_ppl")) for r in R.read_metrics(d)]  # noqa: E731
    reference_dir = next(d for d, _ in outcomes if d.name.startswith("base-"))
    assert logged(directory) == logged(reference_dir)
