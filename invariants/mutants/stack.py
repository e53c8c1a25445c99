"""Mutants of the layers' plumbing and the objective: normalisation, dropout, residual connections, the FFN, the loss."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invariants.mutants.registry import register_mutant
from model.config import TransformerConfig
from model.layers import FeedForward, Residual
from model.objective import label_smoothed_loss
from model.transformer import Parts, Transformer


@register_mutant(
    "norm_across_batch",
    bug="normalisation over the batch and time instead of each position's features",
    caught_by=("batch_independence", "padding_invariance"),
    part="norm",
)
class BatchStatisticsNorm(nn.Module):
    """Normalises each feature over batch and time (a batch norm that always uses batch statistics)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model)), eps

    def forward(self, x: Tensor) -> Tensor:
        mean, var = x.mean(dim=(0, 1), keepdim=True), x.var(dim=(0, 1), unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@register_mutant("dropout_in_eval", bug="dropout left on in eval mode", caught_by=("eval_determinism",), part="dropout")
class AlwaysDropout(nn.Dropout):
    """F.dropout(x, p, training=True): the module ignores model.eval()."""

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, training=True)


@register_mutant(
    "loss_over_all_tokens",
    bug="label-smoothed loss averaged over all tokens, padding included",
    caught_by=("loss_pad_normalisation",),
    part="loss",
)
def loss_over_all_tokens(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """Summed over non-pad tokens but divided by every token, padding included."""
    total = F.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=eps, reduction="sum"
    )
    return total / target.numel()


@register_mutant(
    "dropout_never",
    bug="dropout called as F.dropout(x, p, training=False): never applied, also in training",
    caught_by=("dropout_active",),
    part="dropout",
    known_bug=False,
)
def dropout_never(p: float) -> nn.Module:
    return nn.Identity()


@register_mutant(
    "dropout_keep_probability",
    bug="P_drop taken as the probability to keep (TensorFlow's keep_prob): 1 - P_drop dropped",
    caught_by=("residual_dropout",),
    part="dropout",
    known_bug=False,
)
def dropout_keep_probability(p: float) -> nn.Module:
    return nn.Dropout(1 - p)


@register_mutant(
    "dropout_detaches",
    bug="hand-written dropout on x.data cuts the gradient",
    caught_by=("gradients_reach_all",),
    part="dropout",
    known_bug=False,
)
class DetachingDropout(nn.Dropout):
    """A hand-written dropout on x.data: right values, but the gradient stops here in training."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        keep = (torch.rand_like(x) >= self.p).to(x.dtype)
        return x.data * keep / (1 - self.p)


@register_mutant(
    "loss_log_of_softmax",
    bug="loss from log(softmax(x)): infinite at large logits",
    caught_by=("loss_eps_zero_is_nll",),
    part="loss",
    known_bug=False,
)
def loss_log_of_softmax(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """log(softmax(x)) instead of log_softmax(x): -inf once a probability underflows."""
    log_p = torch.log(torch.softmax(logits, dim=-1))
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    per_token = (1 - eps) * nll - eps * log_p.mean(-1)
    return per_token[target != pad_id].mean()


@register_mutant(
    "loss_ignores_eps",
    bug="label smoothing eps never reaches the loss",
    caught_by=("loss_smoothed_minimum",),
    part="loss",
    known_bug=False,
)
def loss_ignores_eps(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """The config's eps_ls never reaches the loss."""
    return label_smoothed_loss(logits, target, pad_id, 0.0)


class NoResidual(Residual):
    """A sub-layer connection that forgets its residual: LayerNorm(Sublayer(x)) for LayerNorm(x + Sublayer(x))."""

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.norm(self.dropout(sublayer_out))


@register_mutant(
    "ffn_without_residual",
    bug="feed-forward sub-layers without their residual connection",
    caught_by=("residual_paths",),
    known_bug=False,
)
class FfnWithoutResidual(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in [*self.encoder, *self.decoder]:
            layer.res_ffn = NoResidual(cfg, parts.norm, parts.dropout)


@register_mutant(
    "cross_attention_without_residual",
    bug="decoder cross-attention without its residual connection",
    caught_by=("residual_paths",),
    known_bug=False,
)
class CrossAttentionWithoutResidual(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        for layer in self.decoder:
            layer.res_cross = NoResidual(cfg, parts.norm, parts.dropout)


class OtherActivation(FeedForward):
    """FFN(x) = f(x W1 + b1) W2 + b2 with another f where eq. (2) has max(0, z)."""

    def __init__(self, cfg: TransformerConfig, activation: Callable[[Tensor], Tensor]) -> None:
        super().__init__(cfg)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))


def with_feed_forwards(model: Transformer, make: Callable[[], nn.Module], decoder_only: bool = False) -> None:
    """Replace the FFN of every layer (of the decoder's only, with decoder_only) by a new make()."""
    for layer in [*([] if decoder_only else model.encoder), *model.decoder]:
        layer.ffn = make()


def identity(x: Tensor) -> Tensor:
    """No activation, as when it is left out of a Sequential: FFN(x) = (x W1 + b1) W2 + b2."""
    return x


@register_mutant(
    "ffn_without_relu",
    bug="feed-forward networks without their ReLU: two linear maps in a row",
    caught_by=("ffn_nonlinear",),
    known_bug=False,
)
class FfnWithoutRelu(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: OtherActivation(cfg, identity))


@register_mutant(
    "decoder_ffn_without_relu",
    bug="the decoder's feed-forward networks without their ReLU",
    caught_by=("ffn_nonlinear",),
    known_bug=False,
)
class DecoderFfnWithoutRelu(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: OtherActivation(cfg, identity), decoder_only=True)


@register_mutant(
    "ffn_gelu",
    bug="feed-forward networks with GELU (BERT's and GPT's activation) in place of eq. (2)'s ReLU",
    caught_by=("ffn_relu", "oracle_logits"),
    known_bug=False,
)
class FfnGelu(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: OtherActivation(cfg, F.gelu))


@register_mutant(
    "ffn_leaky_relu",
    bug="feed-forward networks with a leaky ReLU (slope 0.01 below 0) in place of eq. (2)'s ReLU",
    caught_by=("ffn_relu",),
    known_bug=False,
)
class FfnLeakyRelu(Transformer):
    """Positively homogeneous like ReLU, but not 0 below 0."""

    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_feed_forwards(self, lambda: OtherActivation(cfg, F.leaky_relu))


@register_mutant(
    "no_layer_norm",
    bug="sub-layer connections x + Sublayer(x), the LayerNorm left out",
    caught_by=("layer_norm_outputs",),
    part="norm",
    known_bug=False,
)
def no_layer_norm(d_model: int) -> nn.Module:
    return nn.Identity()


class DropoutAfterSum(Residual):
    """LayerNorm(Dropout(x + Sublayer(x))): the residual stream dropped together with the sub-layer's output."""

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.norm(self.dropout(x + sublayer_out))


class DropoutAfterNorm(Residual):
    """Dropout(LayerNorm(x + Sublayer(x))): dropout moved past the normalisation."""

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.dropout(self.norm(x + sublayer_out))


def with_connections(model: Transformer, connection: type[Residual], cfg: TransformerConfig, parts: Parts) -> None:
    """Replace every sub-layer connection of the model's layers by `connection`."""
    for layer in [*model.encoder, *model.decoder]:
        for name, module in list(layer.named_children()):
            if isinstance(module, Residual):
                setattr(layer, name, connection(cfg, parts.norm, parts.dropout))


@register_mutant(
    "dropout_after_residual_sum",
    bug="dropout on the residual sum, LayerNorm(Dropout(x + Sublayer(x)))",
    caught_by=("residual_dropout",),
    known_bug=False,
)
class ResidualSumDropped(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_connections(self, DropoutAfterSum, cfg, parts)


@register_mutant(
    "dropout_after_norm",
    bug="dropout after the LayerNorm, Dropout(LayerNorm(x + Sublayer(x)))",
    caught_by=("residual_dropout",),
    known_bug=False,
)
class NormOutputDropped(Transformer):
    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__(cfg, parts)
        with_connections(self, DropoutAfterNorm, cfg, parts)


@register_mutant(
    "rms_norm",
    bug="RMSNorm where section 3.1 has LayerNorm: no centring and no bias",
    caught_by=("oracle_encoder", "oracle_logits"),  # scale-invariant like LayerNorm: layer_norm_outputs passes
    part="norm",
    known_bug=False,
)
def rms_norm(d_model: int) -> nn.Module:
    return nn.RMSNorm(d_model, eps=1e-5)
