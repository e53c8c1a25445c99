"""Mutants of how a block is wired (section 3.1 and 5.4): the order of LayerNorm and residual, what each residual adds,
what cross-attention reads, and where dropout acts: on which sub-layer outputs, and not inside a sub-layer. Each is a near miss that every earlier property
passed; a layer's class is swapped for a subclass whose forward differs in that one step, its parameters kept.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from invariants.mutants.registry import register_mutant
from invariants.mutants.stack import with_feed_forwards
from model.attention import MultiHeadAttention, explicit_attention
from model.cache import KVCache
from model.config import TransformerConfig
from model.layers import DecoderLayer, EncoderLayer, FeedForward, Residual
from model.transformer import Parts, Transformer


def normalised_first(residual: Residual, x: Tensor, sublayer) -> Tensor:
    """x + Dropout(Sublayer(LayerNorm(x))): the pre-LN order, with the residual's own norm and dropout."""
    return x + residual.dropout(sublayer(residual.norm(x)))


class PreLNEncoderLayer(EncoderLayer):
    """An encoder layer in the pre-LN order; the last layer of the stack ends in a LayerNorm of its own (`final`)."""

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        x = normalised_first(self.res_attn, x, lambda h: self.self_attn(h, h, allowed))
        x = normalised_first(self.res_ffn, x, self.ffn)
        return self.final(x) if hasattr(self, "final") else x


class PreLNDecoderLayer(DecoderLayer):
    """A decoder layer in the pre-LN order; the last layer of the stack ends in a LayerNorm of its own (`final`)."""

    def forward(
        self, x: Tensor, memory: Tensor, self_allowed: Tensor, cross_allowed: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        x = normalised_first(self.res_self, x, lambda h: self.self_attn(h, h, self_allowed, cache))
        x = normalised_first(self.res_cross, x, lambda h: self.cross_attn(h, memory, cross_allowed, cache))
        x = normalised_first(self.res_ffn, x, self.ffn)
        return self.final(x) if hasattr(self, "final") else x


@register_mutant(
    "pre_ln_blocks",
    bug="pre-LN blocks, x + Sublayer(LayerNorm(x)), with a final LayerNorm on each stack",
    caught_by=("post_ln_order",),
    known_bug=False,
)
class PreLayerNorm(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for stack, layer_class in ((self.encoder, PreLNEncoderLayer), (self.decoder, PreLNDecoderLayer)):
            for layer in stack:
                layer.__class__ = layer_class
            stack[-1].final = parts.norm(cfg.d_model)


class CrossResidualFromLayerInput(DecoderLayer):
    """The cross-attention sub-layer reads the self-attention sub-layer's output but adds the layer's input back."""

    def forward(
        self, x: Tensor, memory: Tensor, self_allowed: Tensor, cross_allowed: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        attended = self.res_self(x, self.self_attn(x, x, self_allowed, cache))
        x = self.res_cross(x, self.cross_attn(attended, memory, cross_allowed, cache))
        return self.res_ffn(x, self.ffn(x))


@register_mutant(
    "cross_residual_from_layer_input",
    bug="the cross-attention sub-layer's residual adds the decoder layer's input, not its own input",
    caught_by=("residual_own_input",),
    known_bug=False,
)
class CrossResidualSkipsSelfAttention(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in self.decoder:
            layer.__class__ = CrossResidualFromLayerInput


class CrossAttentionOnDecoderStates(DecoderLayer):
    """Cross-attention whose keys and values are the decoder's own states (x, x) instead of the memory, causally masked."""

    def forward(
        self, x: Tensor, memory: Tensor, self_allowed: Tensor, cross_allowed: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        x = self.res_self(x, self.self_attn(x, x, self_allowed, cache))
        own = (
            self_allowed
            if cache is None
            else torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device).tril()
        )
        x = self.res_cross(x, self.cross_attn(x, x, own))
        return self.res_ffn(x, self.ffn(x))


@register_mutant(
    "cross_attention_reads_decoder",
    bug="cross-attention keys and values from the decoder's states, not the encoder's output",
    caught_by=("source_reaches_logits", "gradients_reach_all", "padding_probs_zero"),
    known_bug=False,
)
class CrossAttentionReadsDecoder(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in self.decoder:
            layer.__class__ = CrossAttentionOnDecoderStates


@register_mutant(
    "ffn_output_not_dropped",
    bug="no dropout on the feed-forward sub-layers' outputs",
    caught_by=("dropout_sites",),
    known_bug=False,
)
class FfnOutputNotDropped(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in [*self.encoder, *self.decoder]:
            layer.res_ffn.dropout = nn.Identity()


class DroppedTwice(Residual):
    """LayerNorm(x + Dropout(Dropout(Sublayer(x)))): a dropout in the sub-layer and another in its connection."""

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.norm(x + self.dropout(self.dropout(sublayer_out)))


@register_mutant(
    "attention_output_dropped_twice",
    bug="attention sub-layer outputs dropped twice: in the attention module and again in the residual",
    caught_by=("dropout_sites",),
    known_bug=False,
)
class AttentionOutputDroppedTwice(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in self.encoder:
            layer.res_attn = DroppedTwice(cfg, parts.norm, parts.dropout)
        for layer in self.decoder:
            layer.res_self, layer.res_cross = (DroppedTwice(cfg, parts.norm, parts.dropout) for _ in range(2))


class ProbabilitiesDropped(MultiHeadAttention):
    """Attention whose probabilities are dropped before they weight the values, as torch.nn's and the Annotated
    Transformer's are; the captured probabilities are the undropped ones."""

    def __init__(self, cfg: TransformerConfig, kind: str, layer: int) -> None:
        super().__init__(cfg, kind, layer, self.attend_dropped)
        self.probs_dropout = nn.Dropout(cfg.P_drop)

    def attend_dropped(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, need_weights: bool):
        probs = explicit_attention(q, k, v, allowed)[1]
        return self.probs_dropout(probs) @ v, probs if need_weights else None


@register_mutant(
    "attention_probs_dropped",
    bug="dropout on the attention probabilities, a site section 5.4 does not have",
    caught_by=("dropout_sites",),
    known_bug=False,
)
class AttentionProbsDropped(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for i, layer in enumerate(self.encoder):
            layer.self_attn = ProbabilitiesDropped(cfg, "encoder_self", i)
        for i, layer in enumerate(self.decoder):
            layer.self_attn = ProbabilitiesDropped(cfg, "decoder_self", i)
            layer.cross_attn = ProbabilitiesDropped(cfg, "cross", i)


class ActivationsDropped(FeedForward):
    """FFN(x) = Dropout(max(0, x W1 + b1)) W2 + b2: a dropout between the ReLU and the second linear map."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg)
        self.dropout = nn.Dropout(cfg.P_drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


@register_mutant(
    "ffn_activations_dropped",
    bug="dropout between the feed-forward networks' ReLU and their second linear map, a site section 5.4 does not have",
    caught_by=("dropout_sites",),
    known_bug=False,
)
class FfnActivationsDropped(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: ActivationsDropped(cfg))
