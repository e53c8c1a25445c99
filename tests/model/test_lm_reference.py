"""The reference decoder-only model (model/lm/reference.py): masks, padding, the cache, rotary positions, GQA, the
window, tied weights, generation, half precision and the registry.

Tolerances: float64 throughout, 1e-10 where two computations of the same logits differ only in summation order (a
padded key adds an exact 0, a cached pass sums as the full pass does up to rounding, ~1e-16 relative); exact (0) where
nothing reaches the compared values at all (a later token's key, a probability outside the window)."""

import pytest
import torch
import torch.nn.functional as F

from model.lm.config import LMConfig, lm_preset
from model.lm.protocol import CausalLM, missing_members
from model.lm.reference import DecoderOnly
from model.lm.registry import load_lm
from model.lm.rotary import rotary_angles, rotate

SIZE = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_len=64)
CONFIGS = {
    "small": lm_preset("small").replace(**SIZE),  # the paper's decoder: post-LN, sinusoidal, ReLU, tied
    "modern": lm_preset("modern").replace(**SIZE),  # rotary (half), RMSNorm, pre-LN, SwiGLU, GQA, untied, no bias
    "gpt2": lm_preset("gpt2-small").replace(**SIZE),  # learned positions, pre-LN, GELU
    "windowed": lm_preset("modern").replace(**SIZE, window=3, rotary_layout="interleaved"),
}
EXACT = dict(atol=1e-10, rtol=0)  # float64: the same logits summed in another order


def model(cfg: LMConfig, seed: int = 0) -> DecoderOnly:
    torch.manual_seed(seed)
    return DecoderOnly(cfg).double().eval()


def tokens(rows: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, SIZE["vocab_size"], (rows, length), generator=torch.Generator().manual_seed(seed))


def left_padded(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of these lengths, left-padded with pad_id 0 to the longest."""
    ids, T = tokens(len(lengths), max(lengths), seed), max(lengths)
    pad = torch.arange(T) < T - torch.tensor(lengths)[:, None]
    return ids.masked_fill(pad, 0), pad


def test_logits_are_batch_by_length_by_vocabulary():
    ids = tokens(3, 5)
    assert model(CONFIGS["small"])(ids, torch.zeros_like(ids, dtype=torch.bool)).shape == (3, 5, SIZE["vocab_size"])


@pytest.mark.parametrize("name", CONFIGS)
def test_later_tokens_leave_earlier_logits_bit_identical(name):
    lm, ids = model(CONFIGS[name]), tokens(2, 8)
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 7) % SIZE["vocab_size"]
    pad = torch.zeros_like(ids, dtype=torch.bool)
    before, after = lm(ids, pad), lm(changed, pad)
    assert torch.equal(before[:, :5], after[:, :5])
    assert not torch.equal(before[:, 5:], after[:, 5:])


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_row_gives_the_logits_of_the_row_alone(name, side):
    lm, row = model(CONFIGS[name]), tokens(1, 6)
    alone = lm(row, torch.zeros_like(row, dtype=torch.bool))
    padding = torch.zeros(1, 3, dtype=torch.long)
    ids = torch.cat([padding, row], 1) if side == "left" else torch.cat([row, padding], 1)
    pad = ids == 0 if side == "left" else torch.arange(9)[None] >= 6
    real = lm(ids, pad)[~pad]
    torch.testing.assert_close(real, alone[0], **EXACT)


@pytest.mark.parametrize("name", CONFIGS)
def test_cached_decoding_token_by_token_equals_the_full_pass_also_after_reorder(name):
    lm = model(CONFIGS[name])
    ids, pad = left_padded([3, 5, 2])
    more = tokens(3, 4, seed=2)
    full_ids, full_pad = torch.cat([ids, more], 1), F.pad(pad, (0, 4), value=False)
    cache = lm.new_cache()
    steps = [lm(ids, pad, cache=cache)[:, -1]]
    for t in range(2):
        steps.append(lm(more[:, t : t + 1], full_pad[:, : 6 + t], cache=cache)[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), lm(full_ids, full_pad)[:, 4:7], **EXACT)

    perm = torch.tensor([2, 0, 1])
    lm.reorder_cache(cache, perm)
    for t in range(2, 4):
        step = lm(more[perm, t : t + 1], full_pad[perm, : 6 + t], cache=cache)[:, -1]
        torch.testing.assert_close(step, lm(full_ids[perm], full_pad[perm])[:, 5 + t], **EXACT)


def complex_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """RoFormer's rotation as complex multiplication (eq. 14): pair (a, b) is a + ib, times e^{i angle}."""
    d = torch.arange(x.size(-1))
    first, second = (d[0::2], d[1::2]) if layout == "interleaved" else d.chunk(2)
    turned = torch.complex(x[..., first], x[..., second]) * torch.complex(cos, sin)
    out = torch.empty_like(x)
    out[..., first], out[..., second] = turned.real, turned.imag
    return out


def test_rotary_turns_its_layouts_pairs_by_position_times_theta_and_keeps_norms():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cos, sin = rotary_angles(torch.tensor([[0, 1, 2, 7, 40]] * 2), 8, 10000.0, torch.float64)
    torch.testing.assert_close(cos[0, 0, 1], torch.cos(10000.0 ** (-torch.arange(0, 8, 2) / 8).double()))
    turned = {layout: rotate(x, cos, sin, layout) for layout in ("interleaved", "half")}
    for layout, y in turned.items():
        torch.testing.assert_close(y, complex_rotation(x, cos, sin, layout), **EXACT)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), **EXACT)
        torch.testing.assert_close(y[:, :, 0], x[:, :, 0], atol=0, rtol=0)  # position 0: no turn
    assert not torch.allclose(turned["interleaved"][:, :, 1:], turned["half"][:, :, 1:])


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotary_logits_depend_on_relative_positions_only(layout):
    cfg = CONFIGS["modern"].replace(rotary_layout=layout)
    lm, ids = model(cfg), tokens(2, 6)
    pad, positions = torch.zeros_like(ids, dtype=torch.bool), torch.arange(6).expand(2, 6)
    torch.testing.assert_close(lm(ids, pad, positions + 13), lm(ids, pad, positions), **EXACT)
    assert not torch.allclose(lm(ids, pad, positions * 2), lm(ids, pad, positions))  # not position-blind


def test_rotary_layouts_give_different_models():
    ids = tokens(1, 6)
    pad = torch.zeros_like(ids, dtype=torch.bool)
    logits = [model(CONFIGS["modern"].replace(rotary_layout=lay))(ids, pad) for lay in ("interleaved", "half")]
    assert not torch.allclose(*logits)


def test_query_head_i_reads_key_value_head_i_over_group():
    cfg = CONFIGS["modern"]  # 4 query heads, 2 key/value heads: heads 0, 1 read kv head 0; heads 2, 3 kv head 1
    lm, (ids, pad) = model(cfg), left_padded([4, 6])
    with lm.attention_records() as records:
        lm(ids, pad)
    assert [r.layer for r in records] == [0, 1]
    for r in records:
        assert r.q.shape == (2, 4, 6, cfg.d_head) and r.k.shape == r.v.shape == (2, 2, 6, cfg.d_head)
        scores = r.q @ r.k.repeat_interleave(2, 1).transpose(-2, -1) / cfg.d_head**0.5
        allowed = torch.ones(6, 6, dtype=torch.bool).tril() & ~pad[:, None, None, :]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
        torch.testing.assert_close(r.probs, probs, **EXACT)
        swapped = r.q @ r.k[:, [1, 1, 0, 0]].transpose(-2, -1)  # another grouping
        assert not torch.allclose(scores, swapped / cfg.d_head**0.5)


def test_a_key_window_positions_back_gets_probability_zero_one_inside_more():
    lm, ids = model(CONFIGS["windowed"]), tokens(2, 8)
    with lm.attention_records() as records:
        lm(ids, torch.zeros_like(ids, dtype=torch.bool))
    i = torch.arange(3, 8)
    for r in records:
        assert torch.all(r.probs[:, :, i, i - 3] == 0)
        assert torch.all(r.probs[:, :, i, i - 2] > 0)


def test_tied_embeddings_are_one_parameter_untied_two():
    tied, untied = model(CONFIGS["small"]), model(CONFIGS["modern"])
    weights = tied.embedding_weights()
    assert weights["input"] is weights["output"]
    assert sum(p is weights["input"] for p in tied.parameters()) == 1
    assert untied.embedding_weights()["input"] is not untied.embedding_weights()["output"]


def test_init_is_gpt2s_normal_002_with_zero_biases():
    lm = model(LMConfig(d_model=64))  # 16,384 embedding entries: the std's standard error is ~1e-4
    assert abs(lm.embed.weight.std().item() - 0.02) < 1e-3
    assert lm.blocks[0].attn.w_q.bias.eq(0).all() and lm.blocks[0].norm_attn.weight.eq(1).all()


@pytest.mark.parametrize("name", ["small", "modern"])
def test_generate_equals_the_argmax_of_the_full_pass_over_prompt_and_generated(name):
    lm, (ids, pad) = model(CONFIGS[name]), left_padded([2, 5, 4])
    generated = lm.generate(ids, pad, 5)
    assert generated.shape == (3, 5)
    full = lm(torch.cat([ids, generated], 1), F.pad(pad, (0, 5), value=False))
    assert torch.equal(full[:, 4:-1].argmax(-1), generated)


def test_dropout_is_active_only_in_train_mode():
    lm, ids = model(CONFIGS["small"].replace(dropout=0.5)), tokens(2, 5)
    pad = torch.zeros_like(ids, dtype=torch.bool)
    assert torch.equal(lm(ids, pad), lm(ids, pad))
    assert not torch.equal(lm.train()(ids, pad), lm(ids, pad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["small", "modern"])
def test_half_precision_left_padded_logits_are_finite(name, dtype):
    lm, (ids, pad) = model(CONFIGS[name]).to(dtype), left_padded([1, 6, 3])
    logits = lm(ids, pad)
    assert logits.dtype == dtype and torch.isfinite(logits[~pad]).all()


def test_load_lm_builds_a_preset_with_overrides():
    lm = load_lm("lm-reference:modern,window=3,n_layers=1")
    assert isinstance(lm, DecoderOnly) and isinstance(lm, CausalLM) and not missing_members(lm)
    assert lm.config == lm_preset("modern").replace(window=3, n_layers=1) and len(lm.blocks) == 1
    assert load_lm("lm-reference").config == lm_preset("small")
