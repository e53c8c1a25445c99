"""Training and run bookkeeping: accumulation, checkpoints, divergence, bounded retries, the CLI's one-line errors."""

import json
import math

import pytest
import torch

from ablations.__main__ import main, recorded_data
from ablations.data.batching import make_batch
from ablations.data.corpora import DataError
from ablations.grid import health
from ablations.grid.runner import Grid, prepare_data, run_grid, run_one
from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS, select_rows
from ablations.scoring.decoding import translate
from ablations.scoring.evaluate import perplexity
from ablations.training.checkpoints import TrainState, load_checkpoint, save_checkpoint
from ablations.training.train import loss_of, make_optimizer, train_step
from model import Transformer, TransformerConfig, load_model, parse_spec
from tests.helpers import NO_DATA, REAL_DATA, needs_data

TINY = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=30, max_len=32, P_drop=0.0)
# A few Multi30k pairs, a 150-token BPE and 3 steps: enough to exercise the run bookkeeping in seconds.
TINY_BUDGET = BUDGETS["smoke"].replace(
    steps=3, warmup=3, max_train_pairs=200, vocab_size=150, dev_pairs=6, log_every=1, eval_every=3, checkpoint_every=2
)


class NanAfterTwoSteps(Transformer):
    """The reference model whose loss turns NaN from the third call on: a stand-in for a diverging run."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.calls = 0

    def loss(self, logits, target):
        self.calls += 1
        loss = super().loss(logits, target)
        return loss * math.nan if self.calls > 2 else loss


def nan_loss_model(config: TransformerConfig) -> Transformer:
    return NanAfterTwoSteps(config)


def broken_model(config: TransformerConfig) -> Transformer:
    raise RuntimeError("cannot build this model")


def toy_batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(4, 30, (n,), generator=g).tolist() + [3] for n in (5, 3, 7)]
    tgt = [torch.randint(4, 30, (n,), generator=g).tolist() for n in (4, 6, 2)]
    return src, tgt


def test_accumulated_micro_batches_give_the_loss_and_gradient_of_one_batch_holding_them_all():
    # float64: both paths sum the same per-token gradients in a different order, so they agree to ~1e-16 of
    # gradients of size ~1e-2. Gradients are compared, not updated weights: Adam's first step is g / (|g| + eps),
    # which turns a 1e-17 difference in a near-zero gradient into a visible one.
    src, tgt = toy_batches(0)
    torch.manual_seed(0)
    whole, split = Transformer(TINY).double(), Transformer(TINY).double()
    split.load_state_dict(whole.state_dict())
    opt_whole, opt_split = make_optimizer(whole, torch.device("cpu")), make_optimizer(split, torch.device("cpu"))
    loss_whole = train_step(whole, whole.loss, opt_whole, [make_batch(src, tgt)], lr=1e-3)
    loss_split = train_step(
        split, split.loss, opt_split, [make_batch(src[:1], tgt[:1]), make_batch(src[1:], tgt[1:])], lr=1e-3
    )
    assert loss_split.item() == pytest.approx(loss_whole.item(), rel=1e-12)
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-14)


def test_a_step_on_the_models_own_chunked_loss_equals_a_step_on_the_loss_of_its_logits():
    # float64: the chunked loss sums the same terms in another order (~1e-16 of gradients of size ~1e-2).
    src, tgt = toy_batches(1)
    torch.manual_seed(0)
    chunked, whole = Transformer(TINY).double(), Transformer(TINY).double()
    whole.load_state_dict(chunked.state_dict())
    batches = [make_batch(src[:1], tgt[:1]), make_batch(src[1:], tgt[1:])]
    assert loss_of(chunked) is None and loss_of(torch_nn_model()) is not None
    loss_chunked = train_step(chunked, None, make_optimizer(chunked, torch.device("cpu")), batches, lr=1e-3)
    loss_whole = train_step(whole, whole.loss, make_optimizer(whole, torch.device("cpu")), batches, lr=1e-3)
    assert loss_chunked.item() == pytest.approx(loss_whole.item(), rel=1e-12)
    for a, b in zip(chunked.parameters(), whole.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-14)


def torch_nn_model():
    """A peer through its adapter: it gives logits, and `train_step` applies its `loss` to them."""
    return load_model(parse_spec("torch-nn"), config=TINY)


def test_the_gpus_bf16_autocast_path_trains_and_scores_like_fp32_on_cpu():
    """The bf16 path (autocast, loss and log-probabilities in fp32) run where it can be run here: CPU autocast."""
    src, tgt = toy_batches(2)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    fp32, bf16 = Transformer(TINY), Transformer(TINY)
    bf16.load_state_dict(fp32.state_dict())
    loss32 = train_step(fp32, loss_of(fp32), make_optimizer(fp32, cpu), [make_batch(src, tgt)], lr=1e-3)
    loss16 = train_step(
        bf16, loss_of(bf16), make_optimizer(bf16, cpu), [make_batch(src, tgt)], lr=1e-3, autocast=torch.bfloat16
    )
    # bf16 keeps 8 significant bits (relative rounding 2^-9 per operation); through one layer the loss (~3.5)
    # and the perplexity (~30) move by well under 3%, while a wrong path (no loss, logits in the wrong place) would not.
    assert loss16.item() == pytest.approx(loss32.item(), rel=3e-2)
    ppl32 = perplexity(fp32, src, tgt, cpu)
    assert perplexity(fp32, src, tgt, cpu, autocast=torch.bfloat16) == pytest.approx(ppl32, rel=3e-2)
    hyps = translate(fp32.eval(), src, cpu, extra_len=3, autocast=torch.bfloat16)
    assert len(hyps) == len(src) and all(len(h) <= len(s) + 3 for h, s in zip(hyps, src))


def test_optimizer_is_the_papers_adam():
    opt = make_optimizer(Transformer(TINY), torch.device("cpu"))
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9


def test_a_checkpoint_restores_weights_optimizer_and_random_state(tmp_path):
    src, tgt = toy_batches(1)
    model = Transformer(TINY.replace(P_drop=0.1))
    opt = make_optimizer(model, torch.device("cpu"))
    train_step(model, model.loss, opt, [make_batch(src, tgt)], lr=1e-3)
    progress = TrainState(step=1, tokens_seen=37, wall_s=0.5, epoch=0, index=1)
    save_checkpoint(tmp_path / "ckpt.pt", model, opt, progress)
    expected_draw = torch.rand(3)
    other = Transformer(TINY.replace(P_drop=0.1))
    other_opt = make_optimizer(other, torch.device("cpu"))
    state = load_checkpoint(tmp_path / "ckpt.pt", other, other_opt)
    assert state == progress
    torch.testing.assert_close(torch.rand(3), expected_draw, rtol=0, atol=0)
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert other_opt.state_dict()["state"][0]["step"] == 1


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    if not REAL_DATA.is_dir():
        pytest.skip(NO_DATA)
    runs = tmp_path_factory.mktemp("tiny-runs")
    return runs, prepare_data(TINY_BUDGET, "multi30k", REAL_DATA, runs)


def grid_of(runs, spec: str, rows: str = "base") -> Grid:
    return Grid(TINY_BUDGET, select_rows(rows), [1], parse_spec(spec), runs, torch.device("cpu"), max_attempts=2)


@needs_data
@pytest.mark.slow
def test_a_diverging_run_is_recorded_as_diverged_and_the_grid_goes_on(tiny_data):
    runs, data = tiny_data
    outcomes = run_grid(grid_of(runs / "nan", "tests.ablations.test_train:nan_loss_model", "base,A1"), data)
    assert [status for _, status in outcomes] == ["diverged", "diverged"]
    final = R.read_json(outcomes[0][0] / R.FINAL)
    assert final["steps"] == 3 and "diverged at step 3" in final["error"] and final["dev_ppl"] is None
    table = R.results_table(runs / "nan")
    assert len(table) == 2 and table["dev_ppl"].isna().all()


@needs_data
def test_a_failed_run_is_retried_a_bounded_number_of_times(tiny_data):
    runs, data = tiny_data
    grid = grid_of(runs / "broken", "tests.ablations.test_train:broken_model")
    row = select_rows("base")[0]
    directory, status = run_one(grid, row, 1, data)
    assert status == "failed" and "cannot build this model" in R.read_json(directory / R.FINAL)["error"]
    assert run_one(grid, row, 1, data) == (directory, "failed")
    assert R.failed_attempts(directory) == 2
    run_one(grid, row, 1, data)  # max_attempts=2 reached: not tried again
    assert R.failed_attempts(directory) == 2


@needs_data
def test_a_finished_run_is_never_run_again_or_overwritten(tiny_data):
    runs, data = tiny_data
    grid = grid_of(runs / "done", "reference")
    directory, status = run_one(grid, select_rows("base")[0], 1, data)
    assert status == "finished"
    before = {name: (directory / name).read_bytes() for name in (R.FINAL, R.METRICS, R.CHECKPOINT)}
    assert run_one(grid, select_rows("base")[0], 1, data) == (directory, "finished")
    assert before == {name: (directory / name).read_bytes() for name in before}
    logged = [json.loads(line) for line in (directory / R.METRICS).read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3] and "dev_ppl" in logged[-1]


@needs_data
def test_a_finished_run_records_its_throughput_and_share_of_the_machines_gemm_rate(tiny_data):
    runs, data = tiny_data
    directory, status = run_one(grid_of(runs / "rate", "reference"), select_rows("base")[0], 1, data)
    final = R.read_json(directory / R.FINAL)
    assert status == "finished" and final["tokens_per_s"] > 0
    assert final["compiles"] == 0 and final["compile_s"] == 0.0  # eager on the CPU: nothing compiled
    assert final["tokens_per_s"] == pytest.approx(final["wall_tokens_per_s"])  # so every step is a steady one
    assert 0 < final["gemm_fraction"] < 1  # model FLOPs per second over a measured fp32 GEMM rate on this CPU


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--model", "nonsense"], "error: unknown model 'nonsense'; registered: reference, torch-nn"),
        (["run", "--rows", "base,Z9"], "error: unknown row 'Z9'; valid rows: all, base, A1"),
        (["run", "--rows", "base", "--data", "/nowhere/at/all"], "error: data folder /nowhere/at/all not found"),
        (["run", "--seeds", "one"], "error: --seeds 'one': give seed numbers"),
    ],
)
def test_cli_errors_are_one_line_with_exit_status_2(argv, message, capsys, tmp_path):
    assert main([*argv, "--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@needs_data
def test_publish_copies_results_but_no_checkpoint_and_gathers_them_in_one_table(tiny_data, tmp_path, capsys):
    runs, data = tiny_data
    directory, status = run_one(grid_of(runs / "pub", "reference"), select_rows("base")[0], 1, data)
    assert status == "finished" and (directory / R.CHECKPOINT).is_file()
    assert main(["publish", "--budget", "smoke", "--runs", str(runs / "pub"), "--out", str(tmp_path)]) == 0
    published = tmp_path / "runs" / directory.name
    assert sorted(p.name for p in published.iterdir()) == sorted(R.PUBLISHED)
    assert main(["results", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "all.csv")]) == 0
    assert (tmp_path / "all.csv").read_text() == (tmp_path / "results.csv").read_text()
    baseline = health.read(tmp_path)  # the data's baseline, to judge which runs learned
    assert 1 < baseline.unigram_ppl < 1000
    assert (baseline.vocab, baseline.dev_pairs) == (150, 6)  # the runs' own data, not the smoke budget's


def test_publish_measures_the_baseline_on_the_data_settings_the_runs_recorded(tmp_path):
    for name, dev_pairs in [("base-s1", 50), ("A1-s1", 50), ("A2-s1", None)]:
        (tmp_path / name).mkdir()
        config = {
            "preset": "news",
            "config": {"vocab_size": 500},
            "data": {"max_train_pairs": 90, "dev_pairs": dev_pairs},
        }
        R.write_json(tmp_path / name / R.CONFIG, config)
    budget, preset = recorded_data(BUDGETS["smoke"], [tmp_path / "base-s1", tmp_path / "A1-s1"])
    assert preset == "news" and (budget.vocab_size, budget.max_train_pairs, budget.dev_pairs) == (500, 90, 50)
    assert budget.max_sentence_tokens == BUDGETS["smoke"].max_sentence_tokens  # not recorded: the budget's
    with pytest.raises(DataError, match="2 different data settings .*; publish each set from its own --runs folder"):
        recorded_data(BUDGETS["smoke"], [tmp_path / "base-s1", tmp_path / "A2-s1"])


@needs_data
def test_publish_without_the_data_publishes_the_results_and_says_the_baseline_is_missing(tiny_data, tmp_path, capsys):
    runs, data = tiny_data
    run_one(grid_of(runs / "nodata", "reference"), select_rows("base")[0], 1, data)
    argv = [
        "publish",
        "--budget",
        "smoke",
        "--runs",
        str(runs / "nodata"),
        "--out",
        str(tmp_path),
        "--data",
        "/nowhere",
    ]
    assert main(argv) == 0 and (tmp_path / "results.csv").is_file() and health.read(tmp_path) is None
    assert "no baseline.json, so the reports cannot say which runs learned: data folder /nowhere not found" in (
        capsys.readouterr().out
    )
