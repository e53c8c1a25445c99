"""Mutants of what enters and leaves the stacks: the positional encoding, the embedding scale, the tied output projection."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from invariants.mutants.registry import register_mutant
from model.config import TransformerConfig
from model.layers import PositionalEncoding, embedding_scale, sinusoidal_table
from model.transformer import Parts, Transformer


@register_mutant(
    "pe_concatenated",
    bug="positional encoding with sin and cos concatenated, not interleaved",
    caught_by=("pe_exact_values", "oracle_encoder"),
    part="position_table",
)
def pe_concatenated(positions: int, d_model: int) -> Tensor:
    """[sin ... sin, cos ... cos] instead of sin and cos interleaved."""
    table = sinusoidal_table(positions, d_model)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


@register_mutant(
    "pe_wrong_exponent",
    bug="positional encoding with d_model/2 - 1 in the exponent",
    caught_by=("pe_exact_values",),
    part="position_table",
)
def pe_wrong_exponent(positions: int, d_model: int) -> Tensor:
    """Frequencies 1/10000^(i/(d_model/2 - 1)) (spread from 1 to 1/10000) instead of 1/10000^(2i/d_model)."""
    p = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(d_model // 2, dtype=torch.float64)
    angle = p / 10000 ** (i / max(d_model // 2 - 1, 1))
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)


@register_mutant(
    "pe_positions_from_one",
    bug="positional encoding counting positions from 1",
    caught_by=("pe_exact_values",),
    part="position_table",
)
def pe_positions_from_one(positions: int, d_model: int) -> Tensor:
    return sinusoidal_table(positions + 1, d_model)[1:]


@register_mutant(
    "pe_position_zero",
    bug="every position encoded as position 0",
    caught_by=("permutation_positive_control", "pe_exact_values"),
    part="position_table",
    known_bug=False,
)
def pe_position_zero(positions: int, d_model: int) -> Tensor:
    """Every position gets PE(0): position ids left at zero."""
    return sinusoidal_table(1, d_model).expand(positions, d_model).clone()


@register_mutant(
    "no_embedding_scale",
    bug="embeddings not multiplied by sqrt(d_model)",
    caught_by=("embedding_scaling",),
    part="embed_scale",
    known_bug=False,
)
def unscaled_embeddings(d_model: int) -> float:
    return 1.0


@register_mutant(
    "pe_sin_only",
    bug="positional encoding with sin in the cos columns too",
    caught_by=("pe_relative_linearity", "pe_exact_values"),
    part="position_table",
    known_bug=False,
)
def pe_sin_only(positions: int, d_model: int) -> Tensor:
    """sin in the odd columns too, where cos belongs (a copy-paste slip): no longer a linear function of the offset."""
    table = sinusoidal_table(positions, d_model)
    table[:, 1::2] = table[:, 0::2]
    return table


class OffsetlessEncoding(PositionalEncoding):
    """Positions counted from 0 in every call: cached decoding encodes each new chunk as if it started the sequence."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return super().forward(x, 0)


@register_mutant(
    "cache_ignores_offset",
    bug="cached decoding adds the positions of 0.. to every new chunk",
    caught_by=("cached_decoding", "oracle_cached_decoding"),
    known_bug=False,
)
class CacheIgnoresOffset(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.pe = OffsetlessEncoding(cfg, parts.position_table)


# A plain value, not a function: registered by calling the decorator on it.
register_mutant(
    "untied_embeddings",
    bug="source, target and softmax embeddings not tied",
    caught_by=("params_tied_embeddings", "params_base", "params_table3"),
    part="tie_embeddings",
)(False)


@register_mutant(
    "generator_untied",
    bug="source and target embeddings tied, the pre-softmax linear not",
    caught_by=("params_tied_embeddings", "params_base"),
    known_bug=False,
)
class GeneratorUntied(Transformer):
    """Source and target embeddings shared, but the pre-softmax linear a matrix of its own (the tie forgotten)."""

    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.xavier_uniform_(self.generator.weight)


class ScaledLinear(nn.Linear):
    """x W^T * sqrt(d_model): section 3.4's embedding scale applied where the shared matrix is the pre-softmax linear."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * embedding_scale(self.in_features)


@register_mutant(
    "logits_scaled_like_embeddings",
    bug="pre-softmax linear multiplied by sqrt(d_model), as the embedding layers are (section 3.4 misread)",
    caught_by=("oracle_logits",),
    known_bug=False,
)
class LogitsScaledLikeEmbeddings(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        tied = self.generator.weight
        self.generator = ScaledLinear(cfg.d_model, cfg.vocab_size, bias=False)
        self.generator.weight = tied  # still the shared matrix: only its scale is wrong


@register_mutant(
    "encoder_embedding_unscaled",
    bug="sqrt(d_model) applied in embed() but not on the encoder's path",
    caught_by=("embedding_scaling",),
    known_bug=False,
)
class EncoderEmbeddingUnscaled(Transformer):
    """embed() multiplies by sqrt(d_model), the encoder looks its tokens up without it."""

    def encode(self, src, src_pad):
        return super().encode(src if src.is_floating_point() else self.src_embed(src), src_pad)


@register_mutant(
    "decoder_embedding_unscaled",
    bug="sqrt(d_model) applied in embed() but not when decode() gets ids",
    caught_by=("embedding_scaling",),
    known_bug=False,
)
class DecoderEmbeddingUnscaled(Transformer):
    """embed() multiplies by sqrt(d_model), decode(ids) looks its tokens up without it."""

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        return super().decode(tgt if tgt.is_floating_point() else self.tgt_embed(tgt), memory, src_pad, tgt_pad, cache)


@register_mutant(
    "decoder_without_pe",
    bug="positional encoding added in the encoder only, not to the decoder's embeddings",
    caught_by=("positions_distinguished",),
    known_bug=False,
)
class DecoderWithoutPositions(Transformer):
    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        with self.pe.switched(False):
            return super().decode(tgt, memory, src_pad, tgt_pad, cache)


@register_mutant(
    "no_embedding_dropout",
    bug="no dropout on the sums of the embeddings and the positional encodings",
    caught_by=("residual_dropout",),
    known_bug=False,
)
class NoEmbeddingDropout(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.dropout = nn.Identity()


class ScaledPositions(PositionalEncoding):
    """x + sqrt(d_model) * PE: on ids, (E[ids] + PE) * sqrt(d_model), the positions added before the embedding scale."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + (super().forward(x, offset) - x) * embedding_scale(x.size(-1))


@register_mutant(
    "pe_scaled_with_embeddings",
    bug="positional encoding scaled with the embeddings: (E + PE) * sqrt(d_model)",
    caught_by=("pe_unit_scale",),
    known_bug=False,
)
class PositionsScaledWithEmbeddings(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.pe = ScaledPositions(cfg, parts.position_table)
