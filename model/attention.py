"""Scaled dot-product and multi-head attention (section 3.2), written once for training, decoding and the checks.

Masks are boolean and say which keys a query may attend to (True = allowed), shaped to broadcast
against the scores (B, h, T_q, T_k). A query that may attend to nothing (a fully padded source, say)
gets an all-zero probability row and a zero output, on both paths, and stays finite forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import kernels
from model.cache import KVCache
from model.config import TransformerConfig

# attend(q, k, v, allowed, need_weights) -> (output, probabilities or None)
Attend = Callable[[Tensor, Tensor, Tensor, Tensor, bool], "tuple[Tensor, Tensor | None]"]


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, spelled out so that the probabilities can be returned."""
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-2, -1))  # (B, h, T_q, T_k)
    if not bool(allowed.all()):  # a decoding step, or a batch without padding, has nothing to mask
        # Masked keys get the dtype's lowest value added, not -inf: their probability is exactly 0, and a row
        # with no visible key becomes uniform (not NaN) and is zeroed below. The mask is small (it broadcasts),
        # so the bias costs one add on the scores, which is faster than a masked fill of them.
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~allowed, torch.finfo(q.dtype).min
        )
        scores.add_(bias)
    probs = torch.softmax(scores, dim=-1)
    seen = allowed.any(-1, keepdim=True)
    if not bool(seen.all()):
        probs = probs * seen
    return probs @ v, probs


def explicit_is_faster(q: Tensor, k: Tensor) -> bool:
    """Whether the explicit path beats torch's fused kernel, forward and backward: on CPU at head sizes under 64
    (1.5-1.7x at d_k = 8) or up to 64 keys (1.1-1.3x at d_k = 64, even at 60 keys); on a GPU never.
    `python -m ablations.bench` shows the scaled model's step with the fused kernel everywhere beside it."""
    return q.device.type == "cpu" and (q.size(-1) < 64 or k.size(-2) <= 64)


def causal_mask(queries: int, keys: int, offset: int | Tensor, device: torch.device | None = None) -> Tensor:
    """(queries, keys) bool: the query at absolute position offset + i may see keys at positions <= offset + i
    (`offset` a number, or a one-element tensor on the device: a fixed-shape decoding step's position)."""
    q = torch.arange(queries, device=device).unsqueeze(1) + offset
    return torch.arange(keys, device=device).unsqueeze(0) <= q


def fuses_projections(x: Tensor) -> bool:
    """Whether Q, K and V (self-attention), or K and V (cross-attention), are computed as one product: on a GPU,
    where one wide GEMM and one launch replace three; on the CPU it was no faster (docs/benchmark.md, tried)."""
    return x.device.type == "cuda"


def causal_kernel_applies(x: Tensor) -> bool:
    """Whether a right-padded target's causal self-attention runs as torch's causal kernel with no mask: on a GPU,
    where it skips the masked half; on the CPU the explicit path and the narrow-head kernel stay, as they were."""
    return x.device.type == "cuda"


def attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """The reference attention: a decoding step's few queries, and heads of width up to 8 in training, through the
    fused CPU kernels (model/kernels/); everything else through torch ops (`attend_with_torch_ops`). `allowed` None is
    causal attention in which every key up to a query's position is real (`Transformer.causal_by_kernel`): torch's
    causal kernel, with no mask to read, which lets it skip the masked half and take the flash kernel on a GPU."""
    if allowed is None:
        if need_weights:
            return explicit_attention(q, k, v, causal_mask(q.size(-2), k.size(-2), 0, q.device))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True), None
    if not need_weights and kernels.applies(q, k, v, allowed):
        return kernels.attention(q, k, v, allowed), None
    return attend_with_torch_ops(q, k, v, allowed, need_weights)


def attend_with_torch_ops(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """The explicit path when probabilities are wanted or where it is faster, else torch's fused kernel (which also
    returns zeros for a query with no visible key)."""
    if need_weights or explicit_is_faster(q, k):
        out, probs = explicit_attention(q, k, v, allowed)
        return out, probs if need_weights else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), None


@dataclass
class AttentionRecord:
    """Probabilities captured from one attention module: kind is encoder_self, decoder_self or cross."""

    kind: str
    layer: int
    probs: Tensor  # (B, h, T_q, T_k)


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

    def _plain(self) -> bool:
        """Whether this is the module as written, and W^Q, W^K and W^V the linears it built, with no subclass, wrapper
        or hook that one stacked product would bypass (a check's mutant overrides `_keys_values` or wraps W^Q, say)."""
        return type(self) is MultiHeadAttention and all(
            type(m) is nn.Linear and m.bias is not None and not (m._forward_hooks or m._forward_pre_hooks)
            for m in (self.w_q, self.w_k, self.w_v)
        )

    def _project(self, x: Tensor, linears: tuple[nn.Linear, ...], fused: bool) -> list[Tensor]:
        """Each linear applied to x, as heads; `fused`, as one product with their weights stacked (one GEMM three or
        two times as wide, and one launch), split afterwards: the same numbers, each a sum over d_model."""
        if not fused:
            return [self._heads(m(x)) for m in linears]
        weight, bias = torch.cat([m.weight for m in linears]), torch.cat([m.bias for m in linears])
        return [self._heads(y) for y in F.linear(x, weight, bias).split([m.out_features for m in linears], dim=-1)]

    def _keys_values(self, source: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
        name = f"{self.kind}.{self.layer}"
        if cache is not None and self.kind == "cross" and name in cache.kv:
            return cache.kv[name]  # the memory does not change between decoding steps
        k, v = self._project(source, (self.w_k, self.w_v), fuses_projections(source) and self._plain())
        return self._cached(name, k, v, cache)

    def _cached(self, name: str, k: Tensor, v: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
        """The keys and values to attend to, with the cache's earlier ones (decoder self-attention); stored in it."""
        if cache is not None and self.kind == "decoder_self":
            return cache.append(name, k, v)
        if cache is not None:  # stored contiguous: each step's matmuls then read them in place instead of copying them
            k, v = k.contiguous(), v.contiguous()
            cache.kv[name] = (k, v)
        return k, v

    def forward(self, x: Tensor, source: Tensor, allowed: Tensor, cache: KVCache | None = None) -> Tensor:
        """Queries from x (B, T_q, d_model), keys and values from source (B, T_k, d_model).

        With a cache of `beams` > 1, cross-attention's source has one row per sentence and x `beams` rows: each
        sentence's beams then attend as beams * T_q queries of one row (B / beams, h, beams * T_q, T_k), so the keys
        and values are computed, cached and read once per sentence, not once per beam.
        """
        fused = fuses_projections(x) and self._plain()
        if fused and source is x:  # self-attention: Q, K and V in one product
            q, k, v = self._project(x, (self.w_q, self.w_k, self.w_v), fused)
            k, v = self._cached(f"{self.kind}.{self.layer}", k, v, cache)
        else:
            (q,) = self._project(x, (self.w_q,), fused=False)
            k, v = self._keys_values(source, cache)
        B, _, T, _ = q.shape
        beams = cache.beams if cache is not None and self.kind == "cross" else 1
        if beams > 1:
            q = q.unflatten(0, (-1, beams)).transpose(1, 2).flatten(2, 3)
        out, probs = self.attend(q, k, v, allowed, self.records is not None)
        if self.records is not None:
            self.records.append(AttentionRecord(self.kind, self.layer, probs))
        if beams > 1:
            return self.w_o(out.unflatten(2, (beams, T)).permute(0, 2, 3, 1, 4).reshape(B, T, -1))
        return self.w_o(out.transpose(1, 2).reshape(B, T, -1))
