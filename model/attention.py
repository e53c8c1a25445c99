"""Scaled dot-product and multi-head attention (section 3.2), written once for training, decoding and the checks.

Masks are boolean and say which keys a query may attend to (True = allowed), shaped to broadcast
against the scores (B, h, T_q, T_k). A query that may attend to nothing (a fully padded source, say)
gets an all-zero probability row and a zero output, on both paths, and stays finite forward and backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import TransformerConfig

# attend(q, k, v, allowed, need_weights) -> (output, probabilities or None)
Attend = Callable[[Tensor, Tensor, Tensor, Tensor, bool], "tuple[Tensor, Tensor | None]"]


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, spelled out so that the probabilities can be returned."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T_q, T_k)
    # finfo.min rather than -inf: a fully masked row becomes uniform (not NaN) and is then zeroed.
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)
    return probs @ v, probs


def attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """The reference attention: torch's fused kernel, or the explicit path when probabilities are wanted."""
    if need_weights:
        return explicit_attention(q, k, v, allowed)
    # SDPA returns zeros for fully masked rows, as the explicit path does.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), None


@dataclass
class AttentionRecord:
    """Probabilities captured from one attention module: kind is encoder_self, decoder_self or cross."""

    kind: str
    layer: int
    probs: Tensor  # (B, h, T_q, T_k)


class KVCache:
    """Keys and values of earlier decoder steps (self-attention) and of the memory (cross-attention)."""

    def __init__(self) -> None:
        self.kv: dict[str, tuple[Tensor, Tensor]] = {}
        self.length = 0  # target positions already decoded

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search drops and duplicates hypotheses)."""
        self.kv = {name: (k.index_select(0, index), v.index_select(0, index)) for name, (k, v) in self.kv.items()}


class MultiHeadAttention(nn.Module):
    """h heads of attention; W^Q, W^K: d_model -> h*d_k, W^V: d_model -> h*d_v, W^O: h*d_v -> d_model."""

    def __init__(self, cfg: TransformerConfig, kind: str, layer: int, attend_fn: Attend = attend) -> None:
        super().__init__()
        self.kind, self.layer, self.h = kind, layer, cfg.h
        self.attend = attend_fn
        self.w_q = nn.Linear(cfg.d_model, cfg.h * cfg.d_k)
        self.w_k = nn.Linear(cfg.d_model, cfg.h * cfg.d_k)
        self.w_v = nn.Linear(cfg.d_model, cfg.h * cfg.d_v)
        self.w_o = nn.Linear(cfg.h * cfg.d_v, cfg.d_model)
        self.records: list[AttentionRecord] | None = None  # set while probabilities are being captured

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, -1).transpose(1, 2)  # (B, h, T, d)

    def _keys_values(self, source: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
        name = f"{self.kind}.{self.layer}"
        if cache is not None and self.kind == "cross" and name in cache.kv:
            return cache.kv[name]  # the memory does not change between decoding steps
        k, v = self._heads(self.w_k(source)), self._heads(self.w_v(source))
        if cache is not None:
            if self.kind == "decoder_self" and name in cache.kv:
                past_k, past_v = cache.kv[name]
                k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            cache.kv[name] = (k, v)
        return k, v

    def forward(self, x: Tensor, source: Tensor, allowed: Tensor, cache: KVCache | None = None) -> Tensor:
        """Queries from x (B, T_q, d_model), keys and values from source (B, T_k, d_model)."""
        q = self._heads(self.w_q(x))
        k, v = self._keys_values(source, cache)
        out, probs = self.attend(q, k, v, allowed, self.records is not None)
        if self.records is not None:
            self.records.append(AttentionRecord(self.kind, self.layer, probs))
        B, _, T, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(B, T, -1))
