"""A small decoder-only Transformer written from scratch against model.lm.protocol.CausalLM, by an engineer who read
docs/decoder-only.md and the protocol only (not the reference): an independent correct model for the checks.

Pre-LN or post-LN, RMSNorm or LayerNorm, rotary positions (half or interleaved layout) or none, grouped-query
attention, SwiGLU / ReLU / GELU FFN, tied or untied output, optional sliding window, KV cache, greedy generation.
"""

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from model.lm.config import LMConfig
from model.lm.protocol import LMAttentionRecord


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: LMConfig) -> nn.Module:
    return RMSNorm(cfg.d_model) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float, layout: str) -> torch.Tensor:
    """Rotate x (B, H, T, d) by positions (B, T): pair i turned by angle position * base^(-2i/d)."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)  # (d/2,)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (B, T, d/2)
    cos = angles.cos()[:, None].to(x.dtype)  # (B, 1, T, d/2)
    sin = angles.sin()[:, None].to(x.dtype)
    if layout == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class KVCache:
    def __init__(self, n_layers: int) -> None:
        self.k: list = [None] * n_layers
        self.v: list = [None] * n_layers

    def __len__(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]


class Attention(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.h, self.h_kv, self.d = cfg.n_heads, cfg.kv_heads, cfg.d_head
        self.q_proj = nn.Linear(cfg.d_model, self.h * self.d, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.d_model, self.h_kv * self.d, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.d_model, self.h_kv * self.d, bias=cfg.bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.d_model, bias=cfg.bias)

    def forward(self, x, positions, visible, cache, layer, records):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.h_kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.h_kv, self.d).transpose(1, 2)
        if self.cfg.positions == "rotary":
            q = apply_rotary(q, positions, self.cfg.rotary_base, self.cfg.rotary_layout)
            k = apply_rotary(k, positions, self.cfg.rotary_base, self.cfg.rotary_layout)
        if cache is not None:
            if cache.k[layer] is not None:
                k = torch.cat((cache.k[layer], k), dim=2)
                v = torch.cat((cache.v[layer], v), dim=2)
            cache.k[layer], cache.v[layer] = k, v
        group = self.h // self.h_kv
        kr = k.repeat_interleave(group, dim=1)  # query head i reads key head i // group
        vr = v.repeat_interleave(group, dim=1)
        scores = q @ kr.transpose(-1, -2) / math.sqrt(self.d)
        scores = scores.masked_fill(~visible[:, None], torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        if records is not None:
            records.append(LMAttentionRecord(layer, q.detach(), k.detach(), v.detach(), probs.detach()))
        out = (probs @ vr).transpose(1, 2).reshape(B, T, self.h * self.d)
        return self.o_proj(out)


class FFN(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.kind = cfg.ffn
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        if cfg.ffn == "swiglu":
            self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)

    def forward(self, x):
        if self.kind == "swiglu":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.relu(self.w1(x)) if self.kind == "relu" else F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.attn, self.ffn = Attention(cfg), FFN(cfg)
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, positions, visible, cache, layer, records):
        if self.pre:
            x = x + self.drop(self.attn(self.norm1(x), positions, visible, cache, layer, records))
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, positions, visible, cache, layer, records)))
        return self.norm2(x + self.drop(self.ffn(x)))


class NewcomerLM(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        if cfg.positions not in ("rotary", "none"):
            raise ValueError(f"newcomer_lm supports positions rotary or none, not {cfg.positions!r}")
        self.config = cfg
        self.unsupported: dict[str, str] = {}
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._records = None
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def output_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, ids, pad, positions=None, cache=None):
        B, T = ids.shape
        n_cached = 0 if cache is None else len(cache)
        if pad.shape != (B, n_cached + T):
            raise ValueError(f"pad {tuple(pad.shape)} must cover cached and new positions {(B, n_cached + T)}")
        if positions is None:
            positions = ((~pad).long().cumsum(-1) - 1).clamp(min=0)[:, n_cached:]
        q_idx = torch.arange(n_cached, n_cached + T, device=ids.device)[:, None]
        k_idx = torch.arange(n_cached + T, device=ids.device)[None, :]
        visible = k_idx <= q_idx
        if self.config.window:
            visible = visible & (k_idx > q_idx - self.config.window)
        visible = visible[None] & ~pad[:, None, :]  # (B, T, T_k)
        x = self.embed(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, positions, visible, cache, layer, self._records)
        return F.linear(self.final_norm(x), self.output_weight())

    def new_cache(self) -> KVCache:
        return KVCache(self.config.n_layers)

    def reorder_cache(self, cache: KVCache, index: torch.Tensor) -> KVCache:
        new = KVCache(self.config.n_layers)
        new.k = [None if k is None else k.index_select(0, index) for k in cache.k]
        new.v = [None if v is None else v.index_select(0, index) for v in cache.v]
        return new

    @torch.no_grad()
    def generate(self, ids, pad, steps):
        cache = self.new_cache()
        logits = self.forward(ids, pad, cache=cache)
        out = []
        for step in range(steps):
            token = logits[:, -1].argmax(-1)
            out.append(token)
            if step == steps - 1:
                break
            pad = torch.cat((pad, torch.zeros_like(pad[:, :1])), dim=1)
            logits = self.forward(token[:, None], pad, cache=cache)
        return torch.stack(out, dim=1) if out else ids.new_zeros(ids.shape[0], 0)

    @contextmanager
    def attention_records(self):
        records: list[LMAttentionRecord] = []
        self._records = records
        try:
            yield records
        finally:
            self._records = None

    def embedding_weights(self):
        return {"input": self.embed.weight, "output": self.output_weight()}


def build(cfg: LMConfig) -> "NewcomerLM":
    return NewcomerLM(cfg)
