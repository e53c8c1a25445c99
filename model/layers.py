"""The building blocks of section 3: positional encoding, feed-forward network, post-LN encoder and decoder layers."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, contextmanager
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from model.attention import Attend, MultiHeadAttention
from model.cache import KVCache
from model.config import TransformerConfig

PositionTable = Callable[[int, int], Tensor]  # (positions, d_model) -> (positions, d_model)
NormFactory = Callable[[int], nn.Module]
DropoutFactory = Callable[[float], nn.Module]


def sinusoidal_table(positions: int, d_model: int) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d_model)), PE[p, 2i+1] = cos(p / 10000^(2i/d_model)), section 3.5."""
    p = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = p / 10000 ** (two_i / d_model)  # (positions, d_model/2)
    table = torch.empty(positions, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table


@contextmanager
def temporarily(obj: object, name: str, value: object) -> Iterator[None]:
    """Set obj.name to value for the duration of a with-block, then put the old value back."""
    before = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, before)


class PositionalEncoding(nn.Module):
    """Adds sinusoidal, learned (row E) or no position information; `enabled` switches it off for checks."""

    def __init__(self, cfg: TransformerConfig, table: PositionTable = sinusoidal_table) -> None:
        super().__init__()
        self.kind, self.enabled = cfg.pe, True
        if cfg.pe == "sinusoidal":
            self.register_buffer("fixed", table(cfg.max_len, cfg.d_model).float(), persistent=False)
        elif cfg.pe == "learned":
            self.learned = nn.Embedding(cfg.max_len, cfg.d_model)

    def table(self, positions: int) -> Tensor:
        """The encoding of positions 0 .. positions-1, (positions, d_model)."""
        if self.kind == "sinusoidal":
            return self.fixed[:positions]
        if self.kind == "learned":
            return self.learned.weight[:positions]
        raise ValueError("this model has no positional encoding (pe='none')")

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """x (B, T, d_model) plus the encoding of positions offset .. offset+T-1; or, given `positions` (B, T), of
        those (a packed row's positions within each pair; a fixed-shape decoding step's, from the device)."""
        if self.kind == "none" or not self.enabled:
            return x
        T = x.size(1)
        if offset + T > self.table_len():
            raise ValueError(f"sequence of {offset + T} positions exceeds max_len={self.table_len()}; raise max_len")
        if positions is not None:
            return x + self.table(self.table_len())[positions].to(x.dtype)
        return x + self.table(offset + T)[offset:].to(x.dtype)

    def switched(self, enabled: bool) -> AbstractContextManager[None]:
        """Switch the encoding on or off for the duration of a with-block."""
        return temporarily(self, "enabled", enabled)

    def table_len(self) -> int:
        return self.fixed.size(0) if self.kind == "sinusoidal" else self.learned.num_embeddings


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, eq. (2)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(cfg.d_model, cfg.d_ff), nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(torch.relu(self.w_1(x)))


class Residual(nn.Module):
    """Post-LN residual connection: LayerNorm(x + Dropout(Sublayer(x))), section 3.1 and 5.4."""

    def __init__(self, cfg: TransformerConfig, norm: NormFactory, dropout: DropoutFactory) -> None:
        super().__init__()
        self.norm, self.dropout = norm(cfg.d_model), dropout(cfg.P_drop)

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.norm(x + self.dropout(sublayer_out))


class EncoderLayer(nn.Module):
    def __init__(
        self, cfg: TransformerConfig, layer: int, attend: Attend, norm: NormFactory, dropout: DropoutFactory
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, "encoder_self", layer, attend)
        self.ffn = FeedForward(cfg)
        self.res_attn, self.res_ffn = Residual(cfg, norm, dropout), Residual(cfg, norm, dropout)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        x = self.res_attn(x, self.self_attn(x, x, allowed))
        return self.res_ffn(x, self.ffn(x))


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: TransformerConfig, layer: int, attend: Attend, norm: NormFactory, dropout: DropoutFactory
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, "decoder_self", layer, attend)
        self.cross_attn = MultiHeadAttention(cfg, "cross", layer, attend)
        self.ffn = FeedForward(cfg)
        self.res_self, self.res_cross, self.res_ffn = (Residual(cfg, norm, dropout) for _ in range(3))

    def forward(
        self, x: Tensor, memory: Tensor, self_allowed: Tensor, cross_allowed: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        x = self.res_self(x, self.self_attn(x, x, self_allowed, cache))
        x = self.res_cross(x, self.cross_attn(x, memory, cross_allowed, cache))
        return self.res_ffn(x, self.ffn(x))


def embedding_scale(d_model: int) -> float:
    """Embeddings are multiplied by sqrt(d_model), section 3.4."""
    return math.sqrt(d_model)
