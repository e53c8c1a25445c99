"""The reference model: config validation, attention paths, incremental decoding."""

import pytest
import torch
from hypothesis import given, strategies as st
import torch.nn.functional as F

from model import Transformer, TransformerConfig, kernels
from model.attention import attend, explicit_attention, explicit_is_faster
from model import objective
from model.objective import label_smoothed_loss, label_smoothed_loss_by_torch_ops
from model.transformer import causal_mask, key_padding_allowed

TINY = TransformerConfig(N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=12, vocab_size=50, max_len=64)


def batch(seed: int = 0):
    """Three source/target pairs with ragged source and target padding."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(1, 50, (3, 7), generator=g), torch.randint(1, 50, (3, 5), generator=g)
    src_pad, tgt_pad = torch.zeros(3, 7, dtype=torch.bool), torch.zeros(3, 5, dtype=torch.bool)
    src_pad[0, 5:], src_pad[1, 3:], tgt_pad[1, 3:] = True, True, True
    return src, tgt, src_pad, tgt_pad


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("N", 0, "N=0"),
        ("d_k", -1, "d_k=-1"),
        ("P_drop", 1.0, "P_drop"),
        ("eps_ls", -0.1, "eps_ls"),
        ("pe", "rotary", "pe='rotary'"),
    ],
)
def test_invalid_config_is_a_one_line_error_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        TransformerConfig().replace(**{field: value})
    assert "\n" not in str(info.value)


def test_unknown_config_field_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown config field.*valid fields: N, d_model"):
        TransformerConfig().replace(heads=4)


def test_projections_follow_d_k_and_d_v_not_d_model():
    attn = Transformer(TINY).encoder[0].self_attn
    assert attn.w_q.weight.shape == (4 * 8, 32)
    assert attn.w_v.weight.shape == (4 * 12, 32)
    assert attn.w_o.weight.shape == (32, 4 * 12)


@pytest.mark.parametrize("d_k", [8, 64])
def test_fused_and_explicit_attention_kernels_agree_with_padding_causal_and_empty_rows(d_k):
    # fp32, atol 1e-5: the outputs are O(1) averages of O(1) values, where float32 noise is ~1e-7.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 4, 6, d_k, generator=g) for _ in range(3))
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [True] * 6])  # the third row sees no key at all
    allowed = causal_mask(6, 6, 0) & key_padding_allowed(pad)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    explicit, probs = explicit_attention(q, k, v, allowed)
    chosen, none = attend(q, k, v, allowed, need_weights=False)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chosen, explicit, atol=1e-5, rtol=1e-5)
    assert none is None
    assert probs[~allowed.expand_as(probs)].eq(0).all() and explicit[2].eq(0).all()


def test_explicit_attention_on_a_row_without_keys_has_finite_zero_gradients():
    q, k, v = (torch.randn(1, 2, 3, 8, requires_grad=True) for _ in range(3))
    allowed = torch.tensor([True, True, False]).view(1, 1, 1, 3) & torch.tensor([True, True, False]).view(1, 1, 3, 1)
    out, _ = explicit_attention(q, k, v, allowed)
    out.sum().backward()
    assert out[0, :, 2].eq(0).all() and q.grad[0, :, 2].eq(0).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attention_kernel_is_chosen_by_shape_on_cpu():
    small, wide = torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 64)
    assert explicit_is_faster(small, torch.zeros(1, 1, 500, 8))
    assert explicit_is_faster(wide, torch.zeros(1, 1, 64, 64))
    assert not explicit_is_faster(wide, torch.zeros(1, 1, 65, 64))


def label_smoothed_loss_by_the_kernel(*args, **kwargs):
    """label_smoothed_loss where the CPU kernel takes it; the test is skipped where the kernels cannot be built. Asked
    when the test runs, not at collection, where a fresh checkout's build (about a minute) would hold up every worker."""
    if not kernels.takes_loss(torch.zeros(1)):
        pytest.skip("the kernels cannot be built here (see stderr)")
    return label_smoothed_loss(*args, **kwargs)


def with_and_without_the_loss_kernel(test):
    """Run a loss test on label_smoothed_loss through the CPU kernel and on label_smoothed_loss_by_torch_ops."""
    return pytest.mark.parametrize(
        "loss",
        [
            pytest.param(label_smoothed_loss_by_the_kernel, id="kernel"),
            pytest.param(label_smoothed_loss_by_torch_ops, id="torch-ops"),
        ],
    )(test)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@with_and_without_the_loss_kernel
def test_loss_and_its_gradient_equal_torch_label_smoothed_cross_entropy(eps, loss):
    # float64: the two sum in different orders and agree to ~1e-15.
    g = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(3, 5, 50, generator=g, dtype=torch.float64)).requires_grad_(True)
    target = torch.randint(1, 50, (3, 5), generator=g)
    target[1, 3:] = 0
    ours = loss(logits, target, 0, eps)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    theirs = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0, label_smoothing=eps)
    (theirs_grad,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ours_grad, theirs_grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@with_and_without_the_loss_kernel
def test_a_non_finite_logit_makes_the_loss_non_finite_as_torch_cross_entropy_does(bad, loss):
    logits = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(0))
    logits[0, 1, 4] = bad
    target = torch.tensor([[3, 4, 5], [6, 7, 8]])
    theirs = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0, label_smoothing=0.1)
    torch.testing.assert_close(loss(logits, target, 0, 0.1), theirs, equal_nan=True)  # nan, or inf for a -inf logit


@with_and_without_the_loss_kernel
def test_loss_and_its_gradient_keep_float32_precision_for_logits_far_from_zero(loss):
    # float32 resolves 1e-3 at 1e4: a loss or a softmax formed from the logits before their maximum is taken away
    # loses ~1e-5 relative (the loss) and ~1e-3 (the gradient), torch's cross_entropy ~1e-8 and ~1e-7.
    g = torch.Generator().manual_seed(1)
    logits = (1e4 + torch.randn(4, 5, 3000, generator=g)).requires_grad_()
    target = torch.randint(1, 3000, (4, 5), generator=g)
    exact_logits = logits.detach().double().requires_grad_()
    exact = F.cross_entropy(exact_logits.flatten(0, 1), target.flatten(), ignore_index=0, label_smoothing=0.1)
    (exact_grad,) = torch.autograd.grad(exact, exact_logits)
    ours = loss(logits, target, 0, 0.1)
    (grad,) = torch.autograd.grad(ours, logits)
    torch.testing.assert_close(ours.double(), exact, atol=0, rtol=1e-6)
    assert (grad.double() - exact_grad).abs().max() <= 1e-6 * exact_grad.abs().max()


def test_model_gives_the_same_logits_whether_or_not_attention_probabilities_are_captured():
    model = Transformer(TINY).eval()
    src, tgt, src_pad, tgt_pad = batch()
    fast = model(src, tgt, src_pad, tgt_pad)
    with model.attention_probs() as records:
        explicit = model(src, tgt, src_pad, tgt_pad)
    # logits are O(1) here; 1e-5 is ~100x float32 noise after 2 layers.
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)
    assert sorted({r.kind for r in records}) == ["cross", "decoder_self", "encoder_self"]
    assert len(records) == 3 * TINY.N


def test_fully_padded_source_gives_zero_attention_and_finite_gradients():
    model = Transformer(TINY).train()
    src, tgt, src_pad, tgt_pad = batch()
    src_pad[2] = True
    with model.attention_probs() as records:
        logits = model(src, tgt, src_pad, tgt_pad)
    model.loss(logits, tgt).backward()
    cross = [r.probs for r in records if r.kind == "cross"]
    assert all(p[2].eq(0).all() for p in cross)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("grad", [True, False])
def test_incremental_decoding_step_by_step_equals_one_full_forward_pass(grad):
    model = Transformer(TINY).double().eval()
    src, tgt, src_pad, _ = batch()
    with torch.set_grad_enabled(grad):  # with autograd the cache concatenates; without, it writes into its buffers
        memory = model.encode(src, src_pad)
        no_pad = torch.zeros_like(tgt, dtype=torch.bool)
        full = model.decode(tgt, memory, src_pad, no_pad)
        cache = model.new_cache()
        steps = [
            model.decode(tgt[:, t : t + 1], memory, src_pad, no_pad[:, t : t + 1], cache) for t in range(tgt.size(1))
        ]
    # float64: the two orders of summation agree to ~1e-15; 1e-10 leaves room for accumulation.
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("order", [[2, 2, 0], [2, 0]], ids=["same rows", "a row dropped"])
@pytest.mark.parametrize("grad", [True, False])
def test_cache_reorder_follows_the_beam(grad, order):
    model = Transformer(TINY).double().eval()
    src, tgt, src_pad, _ = batch()
    with torch.set_grad_enabled(grad):
        memory = model.encode(src, src_pad)
        no_pad = torch.zeros_like(tgt, dtype=torch.bool)
        cache = model.new_cache()
        model.decode(tgt[:, :2], memory, src_pad, no_pad[:, :2], cache)
        order = torch.tensor(order)
        cache.reorder(order)
        step = model.decode(tgt[order, 2:3], memory[order], src_pad[order], no_pad[order, 2:3], cache)
        full = model.decode(tgt[order, :3], memory[order], src_pad[order], no_pad[order, :3])
    torch.testing.assert_close(step[:, 0], full[:, 2], atol=1e-10, rtol=1e-10)


@torch.no_grad()
def test_beams_reading_one_memory_row_per_sentence_decode_as_with_the_memory_repeated():
    model = Transformer(TINY).double().eval()
    src, tgt, src_pad, _ = batch()
    memory, beams = model.encode(src, src_pad), 2
    rows = torch.arange(3).repeat_interleave(beams)  # decoder rows 0, 1 read sentence 0, and so on
    tokens, no_pad = tgt[rows], torch.zeros(3 * beams, 1, dtype=torch.bool)
    shared, repeated = model.new_cache(beams), model.new_cache()
    for t in range(tokens.size(1)):
        a = model.decode(tokens[:, t : t + 1], memory, src_pad, no_pad, shared)
        b = model.decode(tokens[:, t : t + 1], memory[rows], src_pad[rows], no_pad, repeated)
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
        swap = torch.tensor([1, 0, 2, 2, 5, 4])  # beams trade places within their sentence, as beam search does
        shared.reorder(swap)
        repeated.reorder(swap)
        tokens = tokens[swap]


def test_one_embedding_matrix_serves_source_target_and_softmax():
    model = Transformer(TINY)
    weights = model.embedding_weights()
    assert weights["source"] is weights["target"] is weights["generator"]


def test_untied_config_gives_three_matrices():
    model = Transformer(TINY.replace(share_embeddings=False))
    w = model.embedding_weights()
    assert len({id(w["source"]), id(w["target"]), id(w["generator"])}) == 3


def test_sequence_longer_than_max_len_is_a_clear_error():
    model = Transformer(TINY.replace(max_len=4))
    src, tgt, src_pad, tgt_pad = batch()
    with pytest.raises(ValueError, match="exceeds max_len=4"):
        model(src, tgt, src_pad, tgt_pad)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_chunked_pre_softmax_loss_and_its_gradients_equal_the_loss_of_the_whole_logits(eps, monkeypatch):
    # float64: the chunks sum the same terms in another order, ~1e-15 apart.
    monkeypatch.setattr(objective, "CHUNK_LOGITS", 3 * 50)  # at most 3 rows a chunk: 5 chunks of 3, 3, 3, 3, 2
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 7, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 50, (2, 7), generator=g)
    target[1, 4:] = 0
    chunked = objective.linear_label_smoothed_loss(hidden, weight, target, 0, eps)
    whole = label_smoothed_loss(hidden @ weight.T, target, 0, eps)
    for ours, theirs in zip(
        torch.autograd.grad(3 * chunked, (hidden, weight)), torch.autograd.grad(3 * whole, (hidden, weight))
    ):
        torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(chunked, whole, atol=1e-12, rtol=1e-12)


@given(rows=st.integers(1, 5000), per_chunk=st.integers(4, 600))
def test_the_loss_chunks_cover_the_rows_in_the_fewest_chunks_of_near_equal_size(rows, per_chunk):
    chunks = objective.chunk_rows(rows, per_chunk)
    sizes = [c.stop - c.start for c in chunks]
    assert (
        chunks[0].start == 0 and chunks[-1].stop == rows and all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
    )
    assert len(chunks) == -(-rows // per_chunk) and max(sizes) <= per_chunk and max(sizes) - min(sizes) <= 1
    assert min(sizes) >= min(rows, per_chunk // 2)  # no last chunk of one row: a compiled scoring's second graph


def test_the_model_given_labels_returns_the_loss_of_its_logits_with_the_same_gradients():
    torch.manual_seed(0)
    model = Transformer(TINY.replace(P_drop=0.0)).double()
    src, tgt, src_pad, tgt_pad = batch()
    labels = tgt.masked_fill(tgt_pad, TINY.pad_id)
    ours = model(src, tgt, src_pad, tgt_pad, labels=labels)
    ours_grads = torch.autograd.grad(ours, list(model.parameters()))
    theirs = model.loss(model(src, tgt, src_pad, tgt_pad), labels)
    theirs_grads = torch.autograd.grad(theirs, list(model.parameters()))
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    for a, b in zip(ours_grads, theirs_grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
