"""Packed batches (several pairs per row, ablations/data/batching.py): the reference computes every pair as it would
alone in a row, forward and backward: attention kept within each pair, positions restarting at each pair."""

import pytest
import torch

from ablations.data.batching import make_batch, make_packed_batch
from ablations.training.backends import sdpa_backend
from model import Transformer, TransformerConfig, attention, kernels
from model.layers import PositionalEncoding
from model.transformer import positions_within
from tests.helpers import needs_cuda

TINY = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=30, max_len=64, P_drop=0.0)
CONFIGS = {"sinusoidal, N=1": TINY, "learned, N=2": TINY.replace(pe="learned", N=2)}
ROWS = [[0, 1, 2], [3], [4, 5]]  # the pairs each packed row holds


def pairs(n: int = 6) -> list[tuple[list[int], list[int]]]:
    """n (source ending in EOS, bare target) pairs of 1 to 8 tokens each side."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 9, (n, 2), generator=g).tolist()
    return [
        (torch.randint(4, 30, (s,), generator=g).tolist() + [3], torch.randint(4, 30, (t,), generator=g).tolist())
        for s, t in lengths
    ]


def packed_and_plain(pad_multiple: int = 8):
    """The pairs packed as ROWS (lengths padded to `pad_multiple`), and the same pairs one per row."""
    p = pairs()
    packed = make_packed_batch([[p[i][0] for i in r] for r in ROWS], [[p[i][1] for i in r] for r in ROWS], pad_multiple)
    return p, packed, make_batch([s for s, _ in p], [t for _, t in p])


def loss_and_gradients(model: Transformer, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = batch.forward(model, with_labels=True)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS)
def test_a_packed_batch_has_the_loss_and_every_gradient_of_its_pairs_one_per_row(cfg, float64):
    torch.manual_seed(0)
    model = Transformer(cfg)
    _, packed, plain = packed_and_plain()
    (loss, grads), (plain_loss, plain_grads) = loss_and_gradients(model, packed), loss_and_gradients(model, plain)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-12, atol=0)
    for (name, _), grad, plain_grad in zip(model.named_parameters(), grads, plain_grads):
        # atol: the keys' biases get a gradient of zero up to round-off (softmax ignores a shift of all its scores)
        torch.testing.assert_close(grad, plain_grad, rtol=1e-10, atol=1e-13, msg=name)


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS)
def test_a_packed_batch_gives_each_pair_the_logits_it_has_alone(cfg, float64):
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    p, packed, plain = packed_and_plain()
    with torch.no_grad():
        logits, alone = packed.forward(model), plain.forward(model)
    for r, row in enumerate(ROWS):
        start = 0
        for i in row:
            n = len(p[i][1]) + 1  # BOS + y
            torch.testing.assert_close(logits[r, start : start + n], alone[i, :n], rtol=1e-12, atol=1e-12)
            start += n


def test_a_packed_batch_through_the_cpu_kernels_gives_what_torch_ops_give(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(TINY)
    _, packed, _ = packed_and_plain()
    (loss, grads) = loss_and_gradients(model, packed)
    monkeypatch.setattr(kernels, "applies", lambda *args: False)
    monkeypatch.setattr(attention, "explicit_is_faster", lambda q, k: False)  # torch's fused kernel, as on a GPU
    (by_ops, grads_by_ops) = loss_and_gradients(model, packed)
    torch.testing.assert_close(loss, by_ops)
    for grad, grad_by_ops in zip(grads, grads_by_ops):
        torch.testing.assert_close(grad, grad_by_ops, rtol=1e-4, atol=1e-6)


@needs_cuda
def test_a_packed_batch_on_a_gpu_has_the_loss_and_gradients_of_its_pairs_one_per_row():
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    model = Transformer(TINY).to(cuda)
    _, packed, plain = packed_and_plain()
    with sdpa_backend("efficient"):  # the kernel a GPU run holds attention to
        (loss, grads), (plain_loss, plain_grads) = [loss_and_gradients(model, b.to(cuda)) for b in (packed, plain)]
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=0)
    for grad, plain_grad in zip(grads, plain_grads):
        torch.testing.assert_close(grad, plain_grad, rtol=1e-4, atol=1e-6)


def test_positions_restart_at_each_pair_and_run_on_through_the_padding():
    segments = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    assert positions_within(segments).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


def test_the_reference_takes_segments_and_a_model_replacing_its_decoder_or_its_positions_does_not():
    class OwnDecode(Transformer):
        def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
            return super().decode(tgt, memory, src_pad, tgt_pad, cache)

    class OwnPositions(PositionalEncoding):
        def forward(self, x, offset=0):
            return super().forward(x, offset)

    replaced = Transformer(TINY)
    replaced.pe = OwnPositions(TINY)
    assert Transformer(TINY).takes_segments
    assert not OwnDecode(TINY).takes_segments and not replaced.takes_segments
