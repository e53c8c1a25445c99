"""Deliberately broken models: the reference Transformer with one bug each, swapped in through a `Parts` seam
or a small subclass that overrides one step.

Each registers itself with `@register_mutant` on its broken part and is a model spec, `mutant:NAME`, so
`nox -s invariants -- --model mutant:no_causal_mask` shows a check failing. MUTANTS keeps the order of
definition: the first thirteen are bugs that have happened in real code; the rest are near misses, plausible
bugs a person writes that a property must catch (not the property's exact negation), at least one per
property. `caught_by` names the properties that must fail on the mutant (tests/test_mutants.py asserts it;
the kill matrices in reports/invariants, at a small and at the base config, show all).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import MultiHeadAttention, explicit_attention
from model.config import TransformerConfig
from model.layers import FeedForward, PositionalEncoding, Residual, sinusoidal_table
from model.objective import label_smoothed_loss
from model.registry import register_model
from model.transformer import Parts, Transformer, causal_mask

CAUSAL = ("causal_future_tokens", "causal_jacobian", "causal_future_probs", "cached_decoding")


@dataclass(frozen=True)
class Mutant:
    """A registered bug: what it is, the broken part (or subclass) that makes it, and the properties that must fail."""

    bug: str
    parts: dict[str, Any]
    caught_by: tuple[str, ...]
    known_bug: bool = True  # one of the fourteen bugs known from real code
    model: type[Transformer] = Transformer  # a subclass that overrides one step, for bugs no Parts seam reaches


MUTANTS: dict[str, Mutant] = {}  # filled by @register_mutant below, in the order of definition


def register_mutant(name: str, bug: str, caught_by: tuple[str, ...], part: str | None = None,
                    known_bug: bool = True) -> Callable[[Any], Any]:
    """Decorator registering mutant `name`: the decorated object replaces Parts.<part>, or without `part` it is a
    Transformer subclass built in the reference's place. A name registered twice is a ValueError."""

    def register(broken: Any) -> Any:
        if name in MUTANTS:
            raise ValueError(f"mutant {name!r} is already registered")
        parts, model = ({part: broken}, Transformer) if part else ({}, broken)
        MUTANTS[name] = Mutant(bug, parts, caught_by, known_bug, model)
        return broken

    return register


def _scores(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


# -- the thirteen bugs known from real code --------------------------------------------------------
@register_mutant("causal_off_by_one", bug="causal mask off by one: each target position sees the next",
                 caught_by=CAUSAL, part="causal_mask")
def causal_off_by_one(queries: int, keys: int, offset: int, device=None) -> Tensor:
    """Each query also sees the next position."""
    return causal_mask(queries, keys, offset + 1, device)


@register_mutant("no_causal_mask", bug="no causal mask in the decoder", caught_by=CAUSAL, part="causal_mask")
def no_causal_mask(queries: int, keys: int, offset: int, device=None) -> Tensor:
    return torch.ones(queries, keys, dtype=torch.bool, device=device)


@register_mutant("mask_after_softmax", bug="mask applied after the softmax",
                 caught_by=("causal_future_tokens", "causal_jacobian", "softmax_rows"), part="attend")
def mask_after_softmax(q, k, v, allowed, need_weights):
    """Softmax over every key, then zero the masked ones: rows stop summing to 1 and the future leaks via the sum."""
    probs = torch.softmax(_scores(q, k), dim=-1) * allowed
    return probs @ v, probs if need_weights else None


@register_mutant("softmax_wrong_axis", bug="softmax over the query axis",
                 caught_by=("causal_future_tokens", "causal_jacobian", "softmax_rows"), part="attend")
def softmax_over_queries(q, k, v, allowed, need_weights):
    """Softmax along the query axis (dim=-2) instead of the key axis."""
    scores = _scores(q, k).masked_fill(~allowed, torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, dim=-2).masked_fill(~allowed, 0.0)
    return probs @ v, probs if need_weights else None


@register_mutant("no_attention_scaling", bug="attention logits not divided by sqrt(d_k)",
                 caught_by=("attention_scaling",), part="attend")
def unscaled_attention(q, k, v, allowed, need_weights):
    """Q K^T without the 1/sqrt(d_k), on both paths."""
    if need_weights:
        return explicit_attention(q * math.sqrt(q.size(-1)), k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0), None


@register_mutant("pe_concatenated", bug="positional encoding with sin and cos concatenated, not interleaved",
                 caught_by=("pe_exact_values",), part="position_table")
def pe_concatenated(positions: int, d_model: int) -> Tensor:
    """[sin ... sin, cos ... cos] instead of sin and cos interleaved."""
    table = sinusoidal_table(positions, d_model)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


@register_mutant("pe_wrong_exponent", bug="positional encoding with d_model/2 - 1 in the exponent",
                 caught_by=("pe_exact_values",), part="position_table")
def pe_wrong_exponent(positions: int, d_model: int) -> Tensor:
    """Frequencies 1/10000^(i/(d_model/2 - 1)) (spread from 1 to 1/10000) instead of 1/10000^(2i/d_model)."""
    p = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(d_model // 2, dtype=torch.float64)
    angle = p / 10000 ** (i / max(d_model // 2 - 1, 1))
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)


@register_mutant("pe_positions_from_one", bug="positional encoding counting positions from 1",
                 caught_by=("pe_exact_values",), part="position_table")
def pe_positions_from_one(positions: int, d_model: int) -> Tensor:
    return sinusoidal_table(positions + 1, d_model)[1:]


@register_mutant("padding_mask_ignored", bug="padding mask ignored: every key visible",
                 caught_by=("padding_probs_zero", "padding_invariance"), part="key_mask")
def padding_ignored(pad: Tensor) -> Tensor:
    return torch.ones_like(pad)[:, None, None, :]


@register_mutant("norm_across_batch", bug="normalisation over the batch and time instead of each position's features",
                 caught_by=("batch_independence", "padding_invariance"), part="norm")
class BatchStatisticsNorm(nn.Module):
    """Normalises each feature over batch and time (a batch norm that always uses batch statistics)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model)), eps

    def forward(self, x: Tensor) -> Tensor:
        mean, var = x.mean(dim=(0, 1), keepdim=True), x.var(dim=(0, 1), unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


# A plain value, not a function: registered by calling the decorator on it.
register_mutant("untied_embeddings", bug="source, target and softmax embeddings not tied",
                caught_by=("params_tied_embeddings", "params_base", "params_table3"), part="tie_embeddings")(False)


@register_mutant("dropout_in_eval", bug="dropout left on in eval mode", caught_by=("eval_determinism",),
                 part="dropout")
class AlwaysDropout(nn.Dropout):
    """F.dropout(x, p, training=True): the module ignores model.eval()."""

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, training=True)


@register_mutant("loss_over_all_tokens", bug="label-smoothed loss averaged over all tokens, padding included",
                 caught_by=("loss_pad_normalisation",), part="loss")
def loss_over_all_tokens(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """Summed over non-pad tokens but divided by every token, padding included."""
    total = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=eps,
                            reduction="sum")
    return total / target.numel()


# -- near misses beyond the known bugs: at least one per property, none the check's exact negation ---
@register_mutant("causal_everywhere", bug="causal mask also applied in the encoder and cross-attention",
                 caught_by=("permutation_encoder", "permutation_cross_attention"), part="attend", known_bug=False)
def causal_everywhere(q, k, v, allowed, need_weights):
    """The decoder's causal mask also applied in the encoder and in cross-attention (masks mixed up)."""
    both = allowed & causal_mask(q.size(-2), k.size(-2), 0, q.device)
    out, probs = explicit_attention(q, k, v, both)
    return out, probs if need_weights else None


@register_mutant("pe_position_zero", bug="every position encoded as position 0",
                 caught_by=("permutation_positive_control", "pe_exact_values"), part="position_table",
                 known_bug=False)
def pe_position_zero(positions: int, d_model: int) -> Tensor:
    """Every position gets PE(0): position ids left at zero."""
    return sinusoidal_table(1, d_model).expand(positions, d_model).clone()


@register_mutant("mask_with_neg_inf", bug="masking with -inf: NaN on a row with nothing to attend to",
                 caught_by=("fully_padded_rows",), part="attend", known_bug=False)
def mask_with_neg_inf(q, k, v, allowed, need_weights):
    """Masked scores set to -inf: a query with no visible key gets softmax(-inf, ..., -inf) = NaN."""
    probs = torch.softmax(_scores(q, k).masked_fill(~allowed, float("-inf")), dim=-1)
    return probs @ v, probs if need_weights else None


@register_mutant("fast_path_ignores_mask", bug="fused attention path called without the mask",
                 caught_by=("fast_equals_explicit", "padding_invariance"), part="attend", known_bug=False)
def fast_path_ignores_mask(q, k, v, allowed, need_weights):
    """The fused path called without the mask; the explicit path (probabilities requested) is right."""
    if need_weights:
        return explicit_attention(q, k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v), None


@register_mutant("dropout_never",
                 bug="dropout called as F.dropout(x, p, training=False): never applied, also in training",
                 caught_by=("dropout_active",), part="dropout", known_bug=False)
def dropout_never(p: float) -> nn.Module:
    return nn.Identity()


@register_mutant("dropout_detaches", bug="hand-written dropout on x.data cuts the gradient",
                 caught_by=("gradients_reach_all",), part="dropout", known_bug=False)
class DetachingDropout(nn.Dropout):
    """A hand-written dropout on x.data: right values, but the gradient stops here in training."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        keep = (torch.rand_like(x) >= self.p).to(x.dtype)
        return x.data * keep / (1 - self.p)


@register_mutant("no_embedding_scale", bug="embeddings not multiplied by sqrt(d_model)",
                 caught_by=("embedding_scaling",), part="embed_scale", known_bug=False)
def unscaled_embeddings(d_model: int) -> float:
    return 1.0


# -- near misses: plausible slips, each a little off what its property demands --------------------
@register_mutant("attention_over_d_k", bug="attention logits divided by d_k instead of sqrt(d_k)",
                 caught_by=("attention_scaling",), part="attend", known_bug=False)
def attention_over_d_k(q, k, v, allowed, need_weights):
    """Q K^T / d_k: the square root forgotten, on both paths."""
    if need_weights:
        return explicit_attention(q / math.sqrt(q.size(-1)), k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0 / q.size(-1)), None


@register_mutant("attention_over_sqrt_d_model", bug="attention logits divided by sqrt(d_model) instead of sqrt(d_k)",
                 caught_by=("attention_scaling",), part="attend", known_bug=False)
def attention_over_sqrt_d_model(q, k, v, allowed, need_weights):
    """Q K^T / sqrt(d_model) (= sqrt(h * d_k)): the model width where the head width belongs, on both paths."""
    d_model = q.size(1) * q.size(-1)
    if need_weights:
        return explicit_attention(q * math.sqrt(q.size(-1) / d_model), k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0 / math.sqrt(d_model)), None


@register_mutant("pe_sin_only", bug="positional encoding with sin in the cos columns too",
                 caught_by=("pe_relative_linearity", "pe_exact_values"), part="position_table", known_bug=False)
def pe_sin_only(positions: int, d_model: int) -> Tensor:
    """sin in the odd columns too, where cos belongs (a copy-paste slip): no longer a linear function of the offset."""
    table = sinusoidal_table(positions, d_model)
    table[:, 1::2] = table[:, 0::2]
    return table


class OffsetlessEncoding(PositionalEncoding):
    """Positions counted from 0 in every call: cached decoding encodes each new chunk as if it started the sequence."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return super().forward(x, 0)


@register_mutant("cache_ignores_offset", bug="cached decoding adds the positions of 0.. to every new chunk",
                 caught_by=("cached_decoding",), known_bug=False)
class CacheIgnoresOffset(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.pe = OffsetlessEncoding(cfg, parts.position_table)


@register_mutant("cross_attention_unmasked", bug="source padding masked in the encoder but not in cross-attention",
                 caught_by=("padding_probs_zero", "padding_invariance"), known_bug=False)
class CrossAttentionUnmasked(Transformer):
    """The source padding mask reaches the encoder but not cross-attention (memory_key_padding_mask forgotten)."""

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        return super().decode(tgt, memory, torch.zeros_like(src_pad), tgt_pad, cache)


@register_mutant("generator_untied", bug="source and target embeddings tied, the pre-softmax linear not",
                 caught_by=("params_tied_embeddings", "params_base"), known_bug=False)
class GeneratorUntied(Transformer):
    """Source and target embeddings shared, but the pre-softmax linear a matrix of its own (the tie forgotten)."""

    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.xavier_uniform_(self.generator.weight)


@register_mutant("encoder_embedding_unscaled", bug="sqrt(d_model) applied in embed() but not on the encoder's path",
                 caught_by=("embedding_scaling",), known_bug=False)
class EncoderEmbeddingUnscaled(Transformer):
    """embed() multiplies by sqrt(d_model), the encoder looks its tokens up without it."""

    def encode(self, src, src_pad):
        return super().encode(src if src.is_floating_point() else self.src_embed(src), src_pad)


@register_mutant("decoder_embedding_unscaled", bug="sqrt(d_model) applied in embed() but not when decode() gets ids",
                 caught_by=("embedding_scaling",), known_bug=False)
class DecoderEmbeddingUnscaled(Transformer):
    """embed() multiplies by sqrt(d_model), decode(ids) looks its tokens up without it."""

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        return super().decode(tgt if tgt.is_floating_point() else self.tgt_embed(tgt), memory, src_pad, tgt_pad, cache)


@register_mutant("loss_log_of_softmax", bug="loss from log(softmax(x)): infinite at large logits",
                 caught_by=("loss_eps_zero_is_nll",), part="loss", known_bug=False)
def loss_log_of_softmax(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """log(softmax(x)) instead of log_softmax(x): -inf once a probability underflows."""
    log_p = torch.log(torch.softmax(logits, dim=-1))
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    per_token = (1 - eps) * nll - eps * log_p.mean(-1)
    return per_token[target != pad_id].mean()


@register_mutant("loss_ignores_eps", bug="label smoothing eps never reaches the loss",
                 caught_by=("loss_smoothed_minimum",), part="loss", known_bug=False)
def loss_ignores_eps(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """The config's eps_ls never reaches the loss."""
    return label_smoothed_loss(logits, target, pad_id, 0.0)


class NoResidual(Residual):
    """A sub-layer connection that forgets its residual: LayerNorm(Sublayer(x)) for LayerNorm(x + Sublayer(x))."""

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.norm(self.dropout(sublayer_out))


@register_mutant("ffn_without_residual", bug="feed-forward sub-layers without their residual connection",
                 caught_by=("residual_paths",), known_bug=False)
class FfnWithoutResidual(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in [*self.encoder, *self.decoder]:
            layer.res_ffn = NoResidual(cfg, parts.norm, parts.dropout)


@register_mutant("cross_attention_without_residual", bug="decoder cross-attention without its residual connection",
                 caught_by=("residual_paths",), known_bug=False)
class CrossAttentionWithoutResidual(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in self.decoder:
            layer.res_cross = NoResidual(cfg, parts.norm, parts.dropout)


class LinearFeedForward(FeedForward):
    """FFN(x) = (x W1 + b1) W2 + b2: eq. (2) without its ReLU, as when the activation is left out of a Sequential."""

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.w_1(x))


@register_mutant("ffn_without_relu", bug="feed-forward networks without their ReLU: two linear maps in a row",
                 caught_by=("ffn_nonlinear",), known_bug=False)
class FfnWithoutRelu(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in [*self.encoder, *self.decoder]:
            layer.ffn = LinearFeedForward(cfg)


@register_mutant("decoder_ffn_without_relu", bug="the decoder's feed-forward networks without their ReLU",
                 caught_by=("ffn_nonlinear",), known_bug=False)
class DecoderFfnWithoutRelu(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in self.decoder:
            layer.ffn = LinearFeedForward(cfg)


@register_mutant("no_layer_norm", bug="sub-layer connections x + Sublayer(x), the LayerNorm left out",
                 caught_by=("layer_norm_outputs",), part="norm", known_bug=False)
def no_layer_norm(d_model: int) -> nn.Module:
    return nn.Identity()


class HeadsByReshape(MultiHeadAttention):
    """Splits heads with a reshape where a transpose belongs: (B, T, h*d) read as (B, h, T, d) mixes positions."""

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.reshape(B, self.h, T, -1)


@register_mutant("heads_by_reshape", bug="heads split by a reshape to (B, h, T, d) instead of a view and a transpose",
                 caught_by=("causal_future_tokens", "permutation_encoder"))
class HeadsSplitByReshape(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for i, layer in enumerate(self.encoder):
            layer.self_attn = HeadsByReshape(cfg, "encoder_self", i, parts.attend)
        for i, layer in enumerate(self.decoder):
            layer.self_attn = HeadsByReshape(cfg, "decoder_self", i, parts.attend)
            layer.cross_attn = HeadsByReshape(cfg, "cross", i, parts.attend)


@register_mutant("decoder_without_pe", bug="positional encoding added in the encoder only, not to the decoder's embeddings",
                 caught_by=("positions_distinguished",), known_bug=False)
class DecoderWithoutPositions(Transformer):
    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        with self.pe.switched(False):
            return super().decode(tgt, memory, src_pad, tgt_pad, cache)


@register_model("mutant", "a reference model with one known bug: mutant:NAME", takes="name")
def build(config: TransformerConfig, name: str | None) -> Transformer:
    """The reference model with mutant `name`'s bug; an unknown or missing name is a ValueError listing them."""
    if name not in MUTANTS:
        what = f"unknown mutant {name!r}" if name else "mutant needs a name (mutant:NAME)"
        raise ValueError(f"{what}; valid mutants: {', '.join(MUTANTS)}")
    mutant = MUTANTS[name]
    return mutant.model(config, Parts(**mutant.parts))
