"""Mutants that a newcomer's own model had and that no check saw at the initial weights or at small scores: a query
bias added after the 1/sqrt(d_k) scale, ReLU6 for ReLU, embedding dropout before the positions are added, an additive
-1e4 mask, embeddings "tied" by copying their values, a key mask rebuilt from lengths. And one correct variant, the
control: a model that computes its softmax and its loss in float32 on purpose, which must pass every property.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invariants.mutants.registry import register_mutant
from invariants.mutants.stack import with_feed_forwards
from model.attention import MultiHeadAttention
from model.config import TransformerConfig
from model.layers import FeedForward, PositionalEncoding
from model.objective import label_smoothed_loss
from model.transformer import Parts, Transformer


class BiasAfterScale(nn.Linear):
    """W^Q whose bias is multiplied by sqrt(d_k): once attention divides the queries by sqrt(d_k), the bias is left
    as it was, x W / sqrt(d_k) + b where the paper has (x W + b) / sqrt(d_k) (a fused QKV written by hand)."""

    def __init__(self, linear: nn.Linear, d_k: int) -> None:
        super().__init__(linear.in_features, linear.out_features)
        self.weight, self.bias, self.factor = linear.weight, linear.bias, math.sqrt(d_k)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias * self.factor)


@register_mutant(
    "query_bias_after_scale",
    bug="the query bias added after the 1/sqrt(d_k) scale",
    caught_by=("oracle_encoder", "oracle_logits"),
    known_bug=False,
)
class QueryBiasAfterScale(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for module in list(self.modules()):
            if isinstance(module, MultiHeadAttention):
                module.w_q = BiasAfterScale(module.w_q, cfg.d_k)


class ReLU6FeedForward(FeedForward):
    """min(max(0, z), 6) where eq. (2) has max(0, z): the same until a pre-activation passes 6."""

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.relu6(self.w_1(x)))


@register_mutant(
    "ffn_relu6",
    bug="ReLU6 in the feed-forward networks instead of ReLU",
    caught_by=("ffn_relu", "oracle_encoder"),
    known_bug=False,
)
class ReLU6Model(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: ReLU6FeedForward(cfg))


class DropoutThenPositions(PositionalEncoding):
    """Dropout(E x sqrt(d_model)) + PE: the embedding dropout of section 5.4 acts before the positions are added."""

    def __init__(self, cfg: TransformerConfig, dropout: nn.Module) -> None:
        super().__init__(cfg)
        self.drop = dropout

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return super().forward(self.drop(x), offset)


@register_mutant(
    "embedding_dropout_before_positions",
    bug="embedding dropout applied to E x sqrt(d_model) before the positional encoding is added",
    caught_by=("dropout_with_positions",),
    known_bug=False,
)
class DropoutBeforePositions(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.pe = DropoutThenPositions(cfg, self.dropout)
        self.dropout = nn.Identity()


@register_mutant(
    "mask_minus_1e4",
    bug="an additive -1e4 mask instead of -inf: masked keys keep weight once scores reach 1e4",
    caught_by=("padding_probs_zero",),
    part="attend",
    known_bug=False,
)
def mask_minus_1e4(q, k, v, allowed, need_weights):
    """Scores + (-1e4) at masked keys (a constant borrowed from float16 code), on both paths."""
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1) - 1e4 * (~allowed).to(q.dtype)
    probs = torch.softmax(scores, dim=-1)
    return probs @ v, probs if need_weights else None


@register_mutant(
    "embeddings_tied_by_copy",
    bug="embeddings 'tied' by copying the matrix's values: three parameters that drift apart",
    caught_by=("tied_embeddings_in_use",),
    known_bug=False,
)
class TiedByCopy(Transformer):
    """Source, target and pre-softmax matrices equal at init by `.data` copies; embedding_weights names one for all."""

    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        self.tgt_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.tgt_embed.weight.data = self.src_embed.weight.data.clone()
        self.generator.weight = nn.Parameter(self.src_embed.weight.data.clone())

    def embedding_weights(self) -> dict[str, Tensor]:
        return {name: self.src_embed.weight for name in ("source", "target", "generator")}


class BiaslessFeedForward(FeedForward):
    """FFN(x) = max(0, x W1) W2: eq. (2) without b1 and b2 (nn.Linear(..., bias=False), as some codebases write it)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg)
        self.w_1, self.w_2 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False), nn.Linear(cfg.d_ff, cfg.d_model, bias=False)


@register_mutant(
    "ffn_without_biases",
    bug="feed-forward networks without the biases b1 and b2 of eq. (2)",
    caught_by=("paper_parameters",),
    known_bug=False,
)
class BiaslessModel(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: BiaslessFeedForward(cfg))


def key_mask_from_lengths(pad: Tensor) -> Tensor:
    """Keys 0 .. length-1 allowed, length the count of non-pad tokens: right for right padding only."""
    lengths = (~pad).sum(-1, keepdim=True)
    return (torch.arange(pad.size(-1), device=pad.device) < lengths)[:, None, None, :]


register_mutant(
    "key_mask_from_lengths",
    bug="the key padding mask rebuilt from lengths: wrong for left-padded rows",
    caught_by=("padding_invariance",),
    part="key_mask",
    known_bug=False,
)(key_mask_from_lengths)


def float32_softmax(q, k, v, allowed, need_weights):
    """The reference attention with its probabilities computed in float32 and cast back, as many libraries do."""
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) * allowed.any(-1, keepdim=True)
    return probs @ v, probs if need_weights else None


def float32_loss(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """The label-smoothed loss computed on float32 logits, returned in the logits' dtype."""
    return label_smoothed_loss(logits.float(), target, pad_id, eps).to(logits.dtype)


@register_mutant(
    "float32_softmax_and_loss",
    bug="none: a correct model whose softmax and loss compute in float32 (a control: it must pass every property)",
    caught_by=(),
    known_bug=False,
    control=True,
)
class Float32SoftmaxAndLoss(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, replace(parts, attend=float32_softmax, loss=float32_loss))
