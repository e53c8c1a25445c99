"""What the GPU path does, shown where it can be run here, on the CPU: batches padded to few shapes, one graph compiled
for them all and its time kept apart, the loss read back at logging steps only, the attention kernel chosen."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ablations.__main__ import main
from ablations.bench import shapes as shapes_report
from ablations.data.batching import BatchStream, make_batch
from ablations.runs import folder as R
from ablations.runs.budgets import SDPA_BACKENDS, TrainSettings
from ablations.training import compiling, train as T
from ablations.training.backends import KERNELS, sdpa_backend
from model import Transformer, TransformerConfig, attention, kernels, objective
from model.batch import Batch
from tests.helpers import needs_data

TINY = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=30, max_len=64, P_drop=0.0)


def varied_pairs(n: int = 120, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """n pairs of token ids with lengths spread over 2..40, as real sentences are."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (n, 2), generator=g).tolist()
    src = [torch.randint(4, 30, (s,), generator=g).tolist() + [3] for s, _ in lengths]
    tgt = [torch.randint(4, 30, (t,), generator=g).tolist() for _, t in lengths]
    return src, tgt


def shapes(stream: BatchStream, steps: int) -> set[tuple[int, ...]]:
    batches = [stream.next() for _ in range(steps)]
    return {(*b.src.shape, b.tgt.shape[1]) for b in batches}


def test_a_padded_batch_has_lengths_a_multiple_of_8_and_the_same_real_tokens():
    src, tgt = varied_pairs(5)
    plain, padded = make_batch(src, tgt), make_batch(src, tgt, pad_multiple=8)
    assert padded.src.shape[1] % 8 == 0 and padded.tgt.shape[1] % 8 == 0
    assert (padded.src_tokens, padded.tgt_tokens) == (plain.src_tokens, plain.tgt_tokens)
    assert torch.equal(padded.src[:, : plain.src.shape[1]], plain.src)


def test_a_stream_padded_to_multiples_of_8_meets_fewer_shapes_within_its_token_budget():
    src, tgt = varied_pairs(600)
    plain = shapes(BatchStream(src, tgt, max_tokens=200, seed=1), 300)
    padded_stream = BatchStream(src, tgt, max_tokens=200, seed=1, pad_multiple=8)
    padded = shapes(padded_stream, 300)
    assert len(padded) < len(plain) / 2
    assert all(rows * max(s, t) <= 200 or rows == 1 for rows, s, t in padded)  # padding counts against max_tokens


def test_every_attention_backend_name_maps_to_a_kernel_and_an_unknown_one_is_refused():
    assert set(KERNELS) == set(SDPA_BACKENDS) - {"default"}
    q = k = v = torch.randn(2, 2, 5, 8)
    with sdpa_backend("math"):
        held = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(held, F.scaled_dot_product_attention(q, k, v))
    with pytest.raises(ValueError, match="unknown attention backend 'cudnm'; valid: default, cudnn"):
        sdpa_backend("cudnm")


def tiny_run(
    tmp_path: Path, steps: int, log_every: int, checkpoint_every: int, compile: bool, precision: str = "fp32"
) -> R.Run:
    settings = TrainSettings(
        steps=steps,
        warmup=4,
        batch_tokens=120,
        accumulation=1,
        max_sentence_tokens=40,
        log_every=log_every,
        eval_every=10_000,
        checkpoint_every=checkpoint_every,
        precision=precision,
        compile=compile,
    )
    run = R.Run.at(tmp_path, {"row": "base", "seed": 1, "budget": "t"}, settings, TINY)
    run.directory.mkdir(parents=True)
    return run


def attention_as_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention through torch's fused kernel, as on a GPU. The CPU's explicit path branches on the data (is any key
    masked?), which breaks the graph, and the C++ CPU kernels' test of the query count guards on a size; on a GPU
    neither runs (the runner compiles on a GPU only)."""
    monkeypatch.setattr(attention, "explicit_is_faster", lambda q, k: False)
    monkeypatch.setattr(kernels, "applies", lambda *args: False)


@pytest.mark.slow
def test_compiled_training_compiles_its_forward_and_its_loss_once_for_many_shapes_and_keeps_time_apart(
    tmp_path, monkeypatch
):
    # The eager backend traces and guards as inductor does (the same graphs, the same recompiles) without code generation.
    monkeypatch.setattr(T, "compile_model", lambda fn: compiling.compile_model(fn, backend="eager"))
    attention_as_on_a_gpu(monkeypatch)
    torch._dynamo.reset()
    run, src, tgt = tiny_run(tmp_path, 24, 6, 24, compile=True), *varied_pairs(400)
    stream = BatchStream(src, tgt, run.settings.micro_tokens, seed=1, pad_multiple=8)
    met = shapes(BatchStream(src, tgt, run.settings.micro_tokens, seed=1, pad_multiple=8), 24)
    state = T.train(Transformer(TINY), run, stream, (src[:4], tgt[:4]), torch.device("cpu"))
    # Every size symbolic from the first step: one graph of the model's forward for them all, and one of its loss's
    # chunk scoring (compiling.compile_model).
    assert len(met) > 5 and state.compiles == 2
    assert 0 < state.compile_s < state.wall_s and state.steady_s == pytest.approx(state.wall_s - state.compile_s)
    logged = R.read_metrics(run.directory)
    assert sum(r["compile_s"] for r in logged) == pytest.approx(state.compile_s)
    assert [r["compiles"] for r in logged] == [2, 0, 0, 0]
    assert logged[0]["step_s_max_all"] > logged[0]["step_s_max"]  # the compiling step, timed apart but not hidden
    assert all(r["step_s_p50"] <= r["step_s_max"] <= r["step_s_max_all"] for r in logged)


@pytest.mark.slow
def test_torchs_default_compiles_again_at_the_first_new_size_where_the_runners_compile_does_not(monkeypatch):
    attention_as_on_a_gpu(monkeypatch)
    stream = BatchStream(*varied_pairs(400), max_tokens=120, seed=1, pad_multiple=8)
    batches = [stream.next() for _ in range(24)]
    graphs = {}
    for dynamic in (None, True):  # torch's default; the runner's (compiling.compile_model's default)
        torch._dynamo.reset()
        model = compiling.compile_model(Transformer(TINY), dynamic=dynamic, backend="eager")
        before = compiling.compiles()
        for b in batches:
            b.forward(model)
        graphs[dynamic] = compiling.compiles() - before
    assert len({(*b.src.shape, b.tgt.shape[1]) for b in batches}) > 5
    assert graphs == {None: 2, True: 1}


@pytest.mark.slow
def test_a_first_batch_whose_two_lengths_match_costs_the_runners_compile_no_second_graph(monkeypatch):
    attention_as_on_a_gpu(monkeypatch)
    gen = torch.Generator().manual_seed(0)

    def batch(source: int, target: int) -> Batch:
        ids = lambda length: torch.randint(1, TINY.vocab_size, (3, length), generator=gen)  # noqa: E731
        no_pad = lambda length: torch.zeros(3, length, dtype=torch.bool)  # noqa: E731
        return Batch(ids(source), ids(target), no_pad(source), no_pad(target))

    batches = [batch(8, 8), batch(16, 8), batch(8, 24)]  # equal lengths first: duck sizing would give them one symbol
    graphs = {}
    for name, compile_fn in {
        "torch.compile": lambda m: torch.compile(m, dynamic=True, backend="eager"),
        "runner": lambda m: compiling.compile_model(m, backend="eager"),
    }.items():
        torch._dynamo.reset()
        model = compile_fn(Transformer(TINY))
        before = compiling.compiles()
        for b in batches:
            b.forward(model)
        graphs[name] = compiling.compiles() - before
    assert graphs == {"torch.compile": 2, "runner": 1}


@pytest.mark.slow
def test_a_compiled_models_chunked_loss_equals_the_eager_one_and_compiles_once_for_every_chunk_size(monkeypatch):
    # aot_eager: the decompositions inductor compiles, run by torch ops; float64, so only the order of sums differs.
    monkeypatch.setattr(objective, "CHUNK_LOGITS", 7 * 50)  # 7 rows a chunk: chunks of 4 to 7 rows below
    torch._dynamo.reset()
    scorer = compiling.compiled_scorer("aot_eager")
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    before = compiling.compiles()
    for rows in (9, 13, 20, 40, 11):
        hidden = torch.randn(rows, 16, generator=g, dtype=torch.float64, requires_grad=True)
        target = torch.randint(0, 50, (rows,), generator=g)
        losses = {}
        for name, scored in {"eager": objective.chunk_scores, "compiled": scorer}.items():
            with objective.chunks_scored_by(scored):
                loss = objective.linear_label_smoothed_loss(hidden, weight, target, 0, 0.1)
            losses[name] = (loss, *torch.autograd.grad(loss, (hidden, weight)))
        for ours, theirs in zip(losses["compiled"], losses["eager"]):
            torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    assert compiling.compiles() - before == 1


class Counted:
    """A step's loss that counts how often it is read back (on a GPU each read waits for the device)."""

    reads = 0

    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss

    def item(self) -> float:
        Counted.reads += 1
        return self.loss.item()


def test_the_loss_is_read_back_only_at_logging_and_checkpoint_steps(tmp_path, monkeypatch):
    step = T.train_step
    monkeypatch.setattr(T, "train_step", lambda *a, **k: Counted(step(*a, **k)))
    Counted.reads = 0
    run, src, tgt = tiny_run(tmp_path, 12, 5, 4, compile=False), *varied_pairs(200)
    T.train(Transformer(TINY), run, BatchStream(src, tgt, 120, seed=1), (src[:4], tgt[:4]), torch.device("cpu"))
    assert Counted.reads == len({5, 10, 12} | {4, 8, 12})
    assert [r["step"] for r in R.read_metrics(run.directory)] == [5, 10, 12]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--compile"], "error: --compile: used on a GPU only (the CPU runs eager, in fp32); leave it out"),
        (["--sdpa-backend", "flash"], "error: --sdpa-backend flash: used on a GPU only"),
        (["--pack"], "error: --pack: used on a GPU only"),
        (["--sdpa-backend", "fastest"], "argument --sdpa-backend: invalid choice: 'fastest'"),
        (["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
    ],
)
def test_gpu_only_flags_on_the_cpu_are_one_line_errors(argv, message, capsys, tmp_path):
    code = main(["run", "--device", "cpu", "--runs", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@needs_data
@pytest.mark.slow
def test_the_shapes_report_counts_shapes_and_padding_at_each_multiple_packed_or_not_and_times_them(tmp_path, capsys):
    argv = ["--budget", "smoke", "--steps", "30", "--pad-multiples", "1,8", "--pack", "--time", "7"]
    assert shapes_report.main([*argv, "--runs", str(tmp_path)]) == 0
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[1:-1]]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 8 ")
    }
    plain, padded, packed = rows["1"], rows["8"], rows["8 packed"]
    assert int(padded[1]) < int(plain[1]) and float(padded[3].rstrip("%")) > float(plain[3].rstrip("%"))
    assert float(packed[3].rstrip("%")) < float(padded[3].rstrip("%")) and set(rows) == {
        "1",
        "1 packed",
        "8",
        "8 packed",
    }
    assert all(float(row[5]) > 0 for row in rows.values())


def test_the_shapes_report_refuses_a_device_it_cannot_use_in_one_line(tmp_path, capsys):
    assert shapes_report.main(["--budget", "smoke", "--time", "2", "--device", "cuda:7", "--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device cuda:7") and len(err.splitlines()) == 1


@pytest.mark.slow
def test_the_shapes_report_counts_no_recompile_over_varied_packed_shapes_with_equal_lengths_first():
    stream = BatchStream(*varied_pairs(400), max_tokens=120, seed=6, pad_multiple=8, pack=True)
    batches = [stream.next() for _ in range(6)]
    ordered, equal = shapes_report.equal_lengths_first(batches)
    assert equal and ordered[0] is batches[1] and ordered[0].src.shape[1] == ordered[0].tgt.shape[1]
    assert len({(*b.src.shape, b.tgt.shape[1]) for b in batches}) == 6
    # One graph of the forward and one of its loss's chunk scoring, each compiled once.
    assert shapes_report.graphs_compiled(batches, TINY) == "2 (the first batch S = T)"
