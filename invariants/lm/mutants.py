"""Decoder-only mutants: the reference decoder-only model with one realistic bug each, at a config where it shows,
and the properties that must fail on it. Registered as `lm-mutant:NAME`; `python -m invariants --kill-matrix
--decoder-only` runs them all."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from model.attention import attend
from model.lm.config import LMConfig, lm_preset
from model.lm.reference import DecoderOnly, SelfAttention, allowed_keys
from model.lm.registry import register_lm
from model.lm.rotary import rotate

SMALL = lm_preset("small")  # the paper's decoder: sinusoidal positions, post-LN, tied
MODERN = lm_preset("modern").replace(n_heads=4, n_kv_heads=2)  # rotary (half layout), RMSNorm, SwiGLU, GQA
WINDOWED = MODERN.replace(window=3)


@dataclass(frozen=True)
class LMMutant:
    """A registered decoder-only bug: what it is, the broken model, its config, and the properties that must fail."""

    bug: str
    model: type[DecoderOnly]
    config: LMConfig
    caught_by: tuple[str, ...]
    control: bool = False  # not a bug: the correct reference at a mutant's config, which must fail nothing
    known_bug: bool = True  # a class of bug found in real decoder-only code (False: a near miss of a property)


LM_MUTANTS: dict[str, LMMutant] = {}


def lm_mutant(
    name: str,
    bug: str,
    config: LMConfig,
    caught_by: tuple[str, ...],
    control: bool = False,
    known_bug: bool = True,
) -> Callable[[type[DecoderOnly]], type[DecoderOnly]]:
    """Register a DecoderOnly subclass as mutant `name`; a name registered twice is a ValueError."""

    def register(model: type[DecoderOnly]) -> type[DecoderOnly]:
        if name in LM_MUTANTS:
            raise ValueError(f"decoder-only mutant {name!r} is already registered")
        LM_MUTANTS[name] = LMMutant(bug, model, config, caught_by, control, known_bug and not control)
        return model

    return register


for preset, config in (("small", SMALL), ("modern", MODERN), ("windowed", WINDOWED)):
    lm_mutant(f"control_{preset}", f"not a bug: the reference at the mutants' {preset} config", config, (), True)(
        DecoderOnly
    )


def attention_with(step: type[SelfAttention]) -> type[DecoderOnly]:
    """The reference model whose self-attention is `step`."""
    return type(f"DecoderOnlyWith{step.__name__}", (DecoderOnly,), {"attention": step})


class RotatedValues(SelfAttention):
    def positioned(self, q, k, v, rotation):
        return rotate(q, *rotation, self.layout), rotate(k, *rotation, self.layout), rotate(v, *rotation, self.layout)


class OtherLayout(SelfAttention):
    def positioned(self, q, k, v, rotation):
        other = "interleaved" if self.layout == "half" else "half"
        return rotate(q, *rotation, other), rotate(k, *rotation, other), v


class TiledHeads(SelfAttention):
    def grouped(self, k, v):
        group = self.h // self.h_kv
        return k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)


class ModelWidthScale(SelfAttention):
    def attend(self, q, k, v, allowed, need_weights):
        return attend(q * math.sqrt(q.size(-1) / (self.h * self.d)), k, v, allowed, need_weights)


class SoftmaxOverQueries(SelfAttention):
    def attend(self, q, k, v, allowed, need_weights):
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~allowed, torch.finfo(q.dtype).min)
        probs = torch.softmax(scores, -2) * allowed  # normalised over the queries, not the keys
        return probs @ v, probs if need_weights else None


class Float32MinMask(SelfAttention):
    def attend(self, q, k, v, allowed, need_weights):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min).to(scores.dtype)
        probs = torch.softmax(scores + bias, -1)  # no row left empty is zeroed: -inf - -inf is NaN in float16
        return probs @ v, probs if need_weights else None


lm_mutant(
    "rotary_on_values",
    "rotary positions applied to the values as well as the queries and keys",
    MODERN,
    ("rotary_rotation", "rotary_relative"),
)(attention_with(RotatedValues))
lm_mutant(
    "rotary_wrong_layout",
    "rotary pairs (2i, 2i+1) where the config (and weights made for it) pair (i, i + d/2)",
    MODERN,
    ("rotary_rotation",),
)(attention_with(OtherLayout))
lm_mutant(
    "kv_heads_tiled",
    "key/value heads repeated whole (head i reads i % n_kv_heads) instead of grouped (i // group)",
    MODERN,
    ("attention_scores",),
)(attention_with(TiledHeads))
lm_mutant(
    "scale_by_d_model",
    "attention scores scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head)",
    MODERN,
    ("attention_scores",),
    known_bug=False,
)(attention_with(ModelWidthScale))
lm_mutant(
    "softmax_over_queries",
    "the attention softmax taken over the queries' axis instead of the keys'",
    SMALL,
    ("softmax_rows", "attention_scores"),
    known_bug=False,
)(attention_with(SoftmaxOverQueries))
lm_mutant(
    "mask_min_float32",
    "the mask adds float32's lowest value whatever the dtype: -inf in float16, a fully masked row turns NaN",
    SMALL,
    ("half_precision_finite",),
)(attention_with(Float32MinMask))


@lm_mutant(
    "left_pad_positions_not_offset",
    "positions counted from the first column, not from a row's first real token: left-padded rows shift",
    SMALL,
    ("padding_invariance",),
)
class PositionsFromColumn(DecoderOnly):
    def positions_of(self, pad: Tensor, past: int) -> Tensor:
        return torch.arange(past, pad.size(1)).expand(pad.size(0), -1)


@lm_mutant(
    "cache_position_off_by_one",
    "a cached step's position one past its place (the new token counted twice)",
    SMALL,
    ("cached_decoding", "cached_after_reorder", "greedy_generation"),
)
class CachePositionOffByOne(DecoderOnly):
    def positions_of(self, pad: Tensor, past: int) -> Tensor:
        return super().positions_of(pad, past) + (1 if past else 0)


@lm_mutant(
    "generate_positions_not_offset",
    "generation gives the prompt and each new token their column as position, ignoring the prompts' left padding",
    SMALL,
    ("greedy_generation",),
)
class GeneratePositionsFromColumn(DecoderOnly):
    @torch.no_grad()
    def generate(self, ids: Tensor, pad: Tensor, steps: int) -> Tensor:
        cache, (rows, length) = self.new_cache(), ids.shape
        token = self(ids, pad, torch.arange(length).expand(rows, -1), cache)[:, -1:].argmax(-1)
        tokens = [token]
        while len(tokens) < steps:
            pad = torch.cat([pad, pad.new_zeros(rows, 1)], 1)
            token = self(token, pad, torch.full((rows, 1), pad.size(1) - 1), cache)[:, -1:].argmax(-1)
            tokens.append(token)
        return torch.cat(tokens, 1)


@lm_mutant(
    "positions_argument_ignored",
    "the positions passed in ignored: positions taken from the column index",
    SMALL,
    ("order_only_from_positions", "padding_invariance"),
    known_bug=False,
)
class PositionsIgnored(DecoderOnly):
    def forward(self, ids, pad, positions=None, cache=None):
        return super().forward(ids, pad, None, cache)

    def positions_of(self, pad: Tensor, past: int) -> Tensor:
        return torch.arange(past, pad.size(1)).expand(pad.size(0), -1)


@lm_mutant(
    "window_off_by_one",
    "the sliding window one key too long (i - j <= window)",
    WINDOWED,
    ("sliding_window", "hidden_keys_zero", "attention_scores"),
)
class WindowOffByOne(DecoderOnly):
    def allowed(self, pad: Tensor, queries: int) -> Tensor:
        return allowed_keys(pad, queries, self.config.window + 1)


@lm_mutant(
    "last_layer_bidirectional",
    "the last layer's mask is padding only: it reads later positions",
    SMALL,
    ("causal_future_tokens", "prefix_alone", "hidden_keys_zero", "cached_decoding"),
    known_bug=False,
)
class LastLayerBidirectional(DecoderOnly):
    def forward(self, ids, pad, positions=None, cache=None):
        last = self.blocks[-1]
        forward = last.forward
        last.forward = lambda x, allowed, rotation, c: forward(
            x, ~pad[:, None, None, :].expand_as(allowed), rotation, c
        )
        try:
            return super().forward(ids, pad, positions, cache)
        finally:
            del last.forward


@lm_mutant(
    "mask_from_first_row",
    "the padding mask built from the batch's first row and used for every row",
    SMALL,
    ("batch_rows_independent", "padding_invariance"),
    known_bug=False,
)
class MaskFromFirstRow(DecoderOnly):
    def allowed(self, pad: Tensor, queries: int) -> Tensor:
        return allowed_keys(pad[:1].expand_as(pad), queries, self.config.window)


@lm_mutant(
    "tied_by_copy",
    "the output layer starts as a copy of the embedding instead of sharing it: they drift apart in training",
    SMALL,
    ("tied_embeddings",),
    known_bug=False,
)
class TiedByCopy(DecoderOnly):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__(cfg)
        self.output.weight = nn.Parameter(self.embed.weight.detach().clone())


@lm_mutant(
    "logits_scaled_by_sqrt_d_model",
    "the output layer scaled by sqrt(d_model) as the embedding is (section 3.4 scales the embedding only)",
    SMALL.replace(d_model=256, d_ff=512),
    ("loss_at_init",),
    known_bug=False,
)
class LogitsScaled(DecoderOnly):
    def forward(self, ids, pad, positions=None, cache=None):
        return super().forward(ids, pad, positions, cache) * math.sqrt(self.config.d_model)


def mutant_config(name: str | None) -> LMConfig:
    """A mutant's own config (where its bug shows); an unknown name is a ValueError listing the known ones."""
    if name not in LM_MUTANTS:
        raise ValueError(f"unknown decoder-only mutant {name!r}; known: {', '.join(LM_MUTANTS)}")
    return LM_MUTANTS[name].config


@register_lm("lm-mutant", "a deliberately broken reference decoder-only model", takes="name", config=mutant_config)
def build_mutant(cfg: LMConfig, name: str) -> DecoderOnly:
    mutant_config(name)
    return LM_MUTANTS[name].model(cfg)
