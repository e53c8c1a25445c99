"""Mutants of attention: the causal and padding masks, the softmax, the 1/sqrt(d_k) scaling, the split into heads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from invariants.mutants.registry import CAUSAL, register_mutant
from model.attention import AttentionRecord, MultiHeadAttention, explicit_attention
from model.cache import KVCache
from model.config import TransformerConfig
from model.transformer import Parts, Transformer, causal_mask


def _scores(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


@register_mutant(
    "causal_off_by_one",
    bug="causal mask off by one: each target position sees the next",
    caught_by=CAUSAL,
    part="causal_mask",
)
def causal_off_by_one(queries: int, keys: int, offset: int, device=None) -> Tensor:
    """Each query also sees the next position."""
    return causal_mask(queries, keys, offset + 1, device)


@register_mutant("no_causal_mask", bug="no causal mask in the decoder", caught_by=CAUSAL, part="causal_mask")
def no_causal_mask(queries: int, keys: int, offset: int, device=None) -> Tensor:
    return torch.ones(queries, keys, dtype=torch.bool, device=device)


@register_mutant(
    "mask_after_softmax",
    bug="mask applied after the softmax",
    caught_by=("causal_future_tokens", "causal_jacobian", "softmax_rows"),
    part="attend",
)
def mask_after_softmax(q, k, v, allowed, need_weights):
    """Softmax over every key, then zero the masked ones: rows stop summing to 1 and the future leaks via the sum."""
    probs = torch.softmax(_scores(q, k), dim=-1) * allowed
    return probs @ v, probs if need_weights else None


@register_mutant(
    "softmax_wrong_axis",
    bug="softmax over the query axis",
    caught_by=("causal_future_tokens", "causal_jacobian", "softmax_rows"),
    part="attend",
)
def softmax_over_queries(q, k, v, allowed, need_weights):
    """Softmax along the query axis (dim=-2) instead of the key axis."""
    scores = _scores(q, k).masked_fill(~allowed, torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, dim=-2).masked_fill(~allowed, 0.0)
    return probs @ v, probs if need_weights else None


@register_mutant(
    "no_attention_scaling",
    bug="attention logits not divided by sqrt(d_k)",
    caught_by=("attention_scaling", "oracle_encoder", "oracle_logits"),
    part="attend",
)
def unscaled_attention(q, k, v, allowed, need_weights):
    """Q K^T without the 1/sqrt(d_k), on both paths."""
    if need_weights:
        return explicit_attention(q * math.sqrt(q.size(-1)), k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0), None


@register_mutant(
    "padding_mask_ignored",
    bug="padding mask ignored: every key visible",
    caught_by=("padding_probs_zero", "padding_invariance"),
    part="key_mask",
)
def padding_ignored(pad: Tensor) -> Tensor:
    return torch.ones_like(pad)[:, None, None, :]


@register_mutant(
    "causal_everywhere",
    bug="causal mask also applied in the encoder and cross-attention",
    caught_by=("permutation_encoder", "permutation_cross_attention"),
    part="attend",
    known_bug=False,
)
def causal_everywhere(q, k, v, allowed, need_weights):
    """The decoder's causal mask also applied in the encoder and in cross-attention (masks mixed up)."""
    both = allowed & causal_mask(q.size(-2), k.size(-2), 0, q.device)
    out, probs = explicit_attention(q, k, v, both)
    return out, probs if need_weights else None


@register_mutant(
    "mask_with_neg_inf",
    bug="masking with -inf: NaN on a row with nothing to attend to",
    caught_by=("fully_padded_rows",),
    part="attend",
    known_bug=False,
)
def mask_with_neg_inf(q, k, v, allowed, need_weights):
    """Masked scores set to -inf: a query with no visible key gets softmax(-inf, ..., -inf) = NaN."""
    probs = torch.softmax(_scores(q, k).masked_fill(~allowed, float("-inf")), dim=-1)
    return probs @ v, probs if need_weights else None


@register_mutant(
    "fast_path_ignores_mask",
    bug="fused attention path called without the mask",
    caught_by=("fast_equals_explicit", "padding_invariance"),
    part="attend",
    known_bug=False,
)
def fast_path_ignores_mask(q, k, v, allowed, need_weights):
    """The fused path called without the mask; the explicit path (probabilities requested) is right."""
    if need_weights:
        return explicit_attention(q, k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v), None


@register_mutant(
    "attention_over_d_k",
    bug="attention logits divided by d_k instead of sqrt(d_k)",
    caught_by=("attention_scaling",),
    part="attend",
    known_bug=False,
)
def attention_over_d_k(q, k, v, allowed, need_weights):
    """Q K^T / d_k: the square root forgotten, on both paths."""
    if need_weights:
        return explicit_attention(q / math.sqrt(q.size(-1)), k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0 / q.size(-1)), None


@register_mutant(
    "attention_over_sqrt_d_model",
    bug="attention logits divided by sqrt(d_model) instead of sqrt(d_k)",
    caught_by=("attention_scaling",),
    part="attend",
    known_bug=False,
)
def attention_over_sqrt_d_model(q, k, v, allowed, need_weights):
    """Q K^T / sqrt(d_model) (= sqrt(h * d_k)): the model width where the head width belongs, on both paths."""
    d_model = q.size(1) * q.size(-1)
    if need_weights:
        return explicit_attention(q * math.sqrt(q.size(-1) / d_model), k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0 / math.sqrt(d_model)), None


@register_mutant(
    "cross_attention_unscaled",
    bug="cross-attention logits not divided by sqrt(d_k), the self-attentions' are",
    caught_by=("attention_scaling", "oracle_decoder"),
    known_bug=False,
)
class CrossAttentionUnscaled(Transformer):
    """The decoder's cross-attention built with the unscaled attend, its self-attentions with the reference's."""

    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for i, layer in enumerate(self.decoder):
            layer.cross_attn = MultiHeadAttention(cfg, "cross", i, unscaled_attention)


@register_mutant(
    "cross_attention_unmasked",
    bug="source padding masked in the encoder but not in cross-attention",
    caught_by=("padding_probs_zero", "padding_invariance"),
    known_bug=False,
)
class CrossAttentionUnmasked(Transformer):
    """The source padding mask reaches the encoder but not cross-attention (memory_key_padding_mask forgotten)."""

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        return super().decode(tgt, memory, torch.zeros_like(src_pad), tgt_pad, cache)


def with_attentions(
    model: Transformer, attention: type[MultiHeadAttention], cfg: TransformerConfig, parts: Parts
) -> None:
    """Every attention of the model (encoder self, decoder self, cross) rebuilt as `attention`."""
    for i, layer in enumerate(model.encoder):
        layer.self_attn = attention(cfg, "encoder_self", i, parts.attend)
    for i, layer in enumerate(model.decoder):
        layer.self_attn = attention(cfg, "decoder_self", i, parts.attend)
        layer.cross_attn = attention(cfg, "cross", i, parts.attend)


class HeadsByReshape(MultiHeadAttention):
    """Splits heads with a reshape where a transpose belongs: (B, T, h*d) read as (B, h, T, d) mixes positions."""

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.reshape(B, self.h, T, -1)


@register_mutant(
    "heads_by_reshape",
    bug="heads split by a reshape to (B, h, T, d) instead of a view and a transpose",
    caught_by=("causal_future_tokens", "permutation_encoder"),
)
class HeadsSplitByReshape(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_attentions(self, HeadsByReshape, cfg, parts)


class ValuesFromKeys(MultiHeadAttention):
    """V = source W^K_i: W^V_i exists (trained, exported) but the values are the keys, a copy-paste of the line above."""

    def _keys_values(self, source: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
        name = f"{self.kind}.{self.layer}"
        if cache is not None and self.kind == "cross" and name in cache.kv:
            return cache.kv[name]
        k = v = self._heads(self.w_k(source))
        if cache is not None and self.kind == "decoder_self":
            return cache.append(name, k, v)
        if cache is not None:
            cache.kv[name] = (k.contiguous(), v.contiguous())
            return cache.kv[name]
        return k, v


@register_mutant(
    "values_from_key_projection",
    bug="values projected with W^K instead of W^V (eq. 1's head_i reads K W^K_i twice)",
    caught_by=("gradients_reach_all", "oracle_encoder", "oracle_logits"),
    known_bug=False,
)
class ValuesFromKeyProjection(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_attentions(self, ValuesFromKeys, cfg, parts)


class MergedByReshape(MultiHeadAttention):
    """Merges the heads' outputs (B, h, T, d_v) with a reshape to (B, T, h * d_v), no transpose back: rows of one head
    at several positions become one position's vector."""

    def forward(self, x: Tensor, source: Tensor, allowed: Tensor, cache: KVCache | None = None) -> Tensor:
        if cache is not None and cache.beams > 1 and self.kind == "cross":
            return super().forward(x, source, allowed, cache)  # beam search's shared memory: left as it was
        q = self._heads(self.w_q(x))
        k, v = self._keys_values(source, cache)
        out, probs = self.attend(q, k, v, allowed, self.records is not None)
        if self.records is not None:
            self.records.append(AttentionRecord(self.kind, self.layer, probs))
        return self.w_o(out.reshape(x.size(0), x.size(1), -1))


@register_mutant(
    "heads_merged_by_reshape",
    bug="heads merged by a reshape of (B, h, T, d_v) to (B, T, h * d_v) without transposing back",
    caught_by=("causal_future_tokens", "permutation_encoder", "oracle_encoder"),
    known_bug=False,
)
class HeadsMergedByReshape(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_attentions(self, MergedByReshape, cfg, parts)
