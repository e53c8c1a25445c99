"""Training in bf16 with fp32 master weights (ablations/training/precision.py): on the CPU, through the functions the
GPU's runner calls (the CLI refuses a bf16 precision there), and one step on a GPU where there is one.

Tolerances are in units of bf16's precision: 8 significant bits, so a rounding moves a value by up to 2^-9 of it and
one value's error after a few operations is a few 2^-8.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ablations.data.batching import BatchStream, make_batch
from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS, PRECISIONS, select_rows, settings_for
from ablations.runs.options import budget_with
from ablations.training import checkpoints as C, train as T
from ablations.training.backends import sdpa_backend
from ablations.training.precision import for_training
from model import Transformer
from model.attention import MultiHeadAttention
from model.batch import Batch
from model.params import working_copy
from tests.ablations.test_gpu_path import TINY, tiny_run, varied_pairs
from tests.helpers import needs_cuda

CPU = torch.device("cpu")
BF16 = torch.bfloat16
ULP = 2.0**-8  # bf16's relative precision


def batches(n: int = 8, seed: int = 0) -> list[Batch]:
    src, tgt = varied_pairs(n, seed)
    return [make_batch(src, tgt)]


def twins() -> tuple[Transformer, Transformer]:
    """Two reference models with the same initial weights: one to train in fp32, one as the master of a bf16 copy."""
    torch.manual_seed(0)
    fp32, master = Transformer(TINY), Transformer(TINY)
    master.load_state_dict(fp32.state_dict())
    return fp32, master


class Float32Made(TorchDispatchMode):
    """The shapes of the float32 tensors of two or more dimensions that torch's ops make, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() >= 2:
                self.shapes.append(tuple(t.shape))
        return out


def test_the_working_copys_residual_stream_is_bf16_and_no_fp32_activation_of_its_size_is_made():
    model = Transformer(TINY)
    working, (batch,) = working_copy(model), batches()
    seen: dict[str, list[torch.dtype]] = {}

    def record(name: str, module: nn.Module) -> None:
        def hook(mod, inputs, output):
            floats = [x for x in (*inputs, output) if x.is_floating_point()]  # the embedding's input is ids
            seen.setdefault(name, []).extend(x.dtype for x in floats)

        module.register_forward_hook(hook)

    record("embedding", working.src_embed)
    for name, module in working.named_modules():
        if isinstance(module, nn.LayerNorm):
            record(name, module)
        if isinstance(module, MultiHeadAttention):
            for projection in ("w_q", "w_k", "w_v"):
                record(f"{name}.{projection}", getattr(module, projection))
    made = Float32Made()
    with made:
        loss = batch.forward(working, with_labels=True)
        loss.backward()
    assert len(seen) == 1 + 5 + 3 * 3  # the embedding, 2 + 3 LayerNorms, Q K V of 3 attentions
    assert {name: set(dtypes) for name, dtypes in seen.items()} == {name: {BF16} for name in seen}
    # Float32 are the loss's scores (target positions, vocab) and its sum of the pre-softmax weight's gradient
    # (vocab, d_model), cast to bf16 once summed (model/objective.py); nothing of the positions times d_model is.
    positions, d, vocab = batch.tgt.numel(), TINY.d_model, TINY.vocab_size
    assert (positions, vocab) in made.shapes and (vocab, d) in made.shapes
    assert [s for s in made.shapes if s[-1] == d and torch.Size(s).numel() >= positions * d] == []
    assert loss.dtype == torch.float32 and working.generator.weight.grad.dtype == BF16


def test_after_a_step_the_master_is_fp32_the_working_copy_its_rounding_and_the_ties_kept():
    _, master = twins()
    optimizer = T.make_optimizer(master, CPU)
    working, stepper = for_training(master, optimizer, "bf16-weights")
    T.train_step(working, T.loss_of(master), stepper, batches(), lr=1e-3)
    for m, w in zip(master.parameters(), working.parameters()):
        assert m.dtype == torch.float32 and m.grad.dtype == torch.float32 and w.dtype == BF16
        assert torch.equal(w, m.to(BF16))
    moments = [v for state in optimizer.state.values() for k, v in state.items() if k != "step"]
    assert len(moments) == 2 * len(list(master.parameters())) and {v.dtype for v in moments} == {torch.float32}
    for model in (master, working):
        assert model.generator.weight is model.src_embed.weight is model.tgt_embed.weight
    assert torch.equal(working.pe.fixed, master.pe.fixed) and working.pe.fixed.dtype == torch.float32
    assert working.training


def test_a_bf16_weights_step_gives_the_loss_gradient_and_update_of_an_fp32_step_to_bf16_precision():
    fp32, master = twins()
    before = [p.detach().clone() for p in fp32.parameters()]
    lr = 1e-3
    loss32 = T.train_step(fp32, T.loss_of(fp32), T.make_optimizer(fp32, CPU), batches(), lr)
    working, stepper = for_training(master, T.make_optimizer(master, CPU), "bf16-weights")
    loss16 = T.train_step(working, T.loss_of(master), stepper, batches(), lr)
    # The loss averages ~250 tokens' float32 log-probabilities of bf16 logits: their roundings mostly cancel
    # (measured 7e-5 relative), so one ULP bounds it.
    assert loss16.item() == pytest.approx(loss32.item(), rel=ULP)
    # A weight's gradient passes through some 15 bf16 roundings forward and back in one layer: 16 ULP (2^-4) bounds
    # the whole gradient's relative error (measured 1.8%; under autocast, whose residual stream is float32, 1.0%).
    # A step that lost the gradients, or copied them to the wrong weights, is off by 100%.
    g32 = torch.cat([p.grad.flatten() for p in fp32.parameters()])
    g16 = torch.cat([p.grad.flatten() for p in master.parameters()])
    assert (g16 - g32).norm() / g32.norm() < 16 * ULP
    # Adam's first update is lr * g / |g| elementwise: the same wherever the two gradients have the same sign, 2 lr
    # apart where a near-zero one (a key bias's, zero in exact arithmetic) flips.
    moved32 = torch.cat([(p.detach() - b).flatten() for p, b in zip(fp32.parameters(), before)])
    moved16 = torch.cat([(p.detach() - b).flatten() for p, b in zip(master.parameters(), before)])
    assert (moved16 - moved32).abs().max() <= 2 * lr * (1 + ULP)
    assert ((moved16 - moved32).abs() < 1e-3 * lr).float().mean() > 0.9  # measured 0.93


def test_twenty_bf16_weights_steps_bring_the_loss_down_as_fp32_steps_do():
    fp32, master = twins()
    working, stepper = for_training(master, T.make_optimizer(master, CPU), "bf16-weights")
    optimizer32, data = T.make_optimizer(fp32, CPU), [batches(8, seed) for seed in range(4)]
    curve32, curve16 = [], []
    for step in range(20):
        curve32.append(T.train_step(fp32, T.loss_of(fp32), optimizer32, data[step % 4], lr=3e-3).item())
        curve16.append(T.train_step(working, T.loss_of(master), stepper, data[step % 4], lr=3e-3).item())
    # Over the four batches, the loss falls from ~3.9 (above ln 30 = 3.4, a uniform guess) to ~3.3 (unigram
    # frequencies); the two runs drift apart by at most 6e-4 of the loss in 20 steps (measured), one ULP allowed.
    assert sum(curve16[-4:]) < sum(curve16[:4]) - 4 * 0.3
    assert curve16 == pytest.approx(curve32, rel=ULP)


class Cut(Exception):
    """The run cut short after a step, as a crash would cut it."""


def test_a_bf16_weights_run_checkpoints_fp32_master_weights_and_resumes_exactly(tmp_path):
    src, tgt = pairs = varied_pairs(60)
    whole, cut = (tiny_run(tmp_path / name, 8, 4, 4, compile=False, precision="bf16-weights") for name in "wc")

    def train(run: R.Run, stop_after: int | None = None) -> None:
        def stop(step: int) -> None:
            if step == stop_after:
                raise Cut

        torch.manual_seed(0)
        model, stream = Transformer(TINY.replace(P_drop=0.1)), BatchStream(*pairs, 120, seed=1)
        with pytest.raises(Cut) if stop_after else nullcontext():
            T.train(model, run, stream, (src[:4], tgt[:4]), CPU, stop)

    train(whole)
    train(cut, stop_after=6)  # checkpointed at step 4; steps 5 and 6 trained and lost
    train(cut)
    saved = [C.read_checkpoint(run.directory / R.CHECKPOINT)["model"] for run in (whole, cut)]
    assert {t.dtype for t in saved[0].values()} == {torch.float32}
    assert [k for k in saved[0] if not torch.equal(saved[0][k], saved[1][k])] == []
    assert [r["step"] for r in R.read_metrics(cut.directory)] == [4, 8]


def test_a_run_trains_the_precision_asked_for_else_bf16_weights_on_a_gpu_and_fp32_on_the_cpu():
    row, cuda = select_rows("base")[0], torch.device("cuda")
    assert settings_for(row, BUDGETS["short"], cuda).precision == "bf16-weights"
    assert settings_for(row, BUDGETS["short"], CPU).precision == "fp32"
    autocasts = {}  # (evaluation's, the training step's)
    for precision in PRECISIONS:
        settings = settings_for(row, budget_with("short", precision=precision), cuda)
        assert settings.precision == precision
        assert settings_for(row, budget_with("short", precision=precision), CPU).precision == precision
        autocasts[precision] = (settings.autocast, settings.step_autocast)
    # bf16-weights: the step's copy is bf16 already; evaluation reads the fp32 master under autocast, as bf16 does.
    assert autocasts == {"fp32": (None, None), "bf16": (BF16, BF16), "bf16-weights": (BF16, None)}
    with pytest.raises(ValueError, match="precision 'fp16': give one of fp32, bf16, bf16-weights"):
        budget_with("short", precision="fp16")


@needs_cuda
def test_on_a_gpu_a_bf16_weights_step_keeps_fp32_master_weights_and_gives_fp32s_loss_to_bf16_precision():
    # What the CPU cannot show: CUDA's multi-tensor copies between bf16 and fp32, fused Adam and the runner's attention
    # kernel on bf16 inputs. Tolerances as on the CPU (above).
    cuda = torch.device("cuda")
    fp32, master = (model.to(cuda) for model in twins())
    batch = batches()[0].to(cuda)
    loss32 = T.train_step(fp32, T.loss_of(fp32), T.make_optimizer(fp32, cuda), [batch], lr=1e-3)
    working, stepper = for_training(master, T.make_optimizer(master, cuda), "bf16-weights")
    with sdpa_backend("efficient"):
        loss16 = T.train_step(working, T.loss_of(master), stepper, [batch], lr=1e-3)
    assert loss16.item() == pytest.approx(loss32.item(), rel=ULP)
    for m, w in zip(master.parameters(), working.parameters()):
        assert m.dtype == m.grad.dtype == torch.float32 and w.dtype == BF16 and torch.equal(w, m.to(BF16))
    g32 = torch.cat([p.grad.flatten() for p in fp32.parameters()])
    g16 = torch.cat([p.grad.flatten() for p in master.parameters()])
    assert (g16 - g32).norm() / g32.norm() < 16 * ULP
