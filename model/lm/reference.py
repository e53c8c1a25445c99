"""The reference decoder-only language model: the paper's decoder without cross-attention (Vaswani et al. 2017,
section 3.1), with the modern options LMConfig names (rotary positions, RMSNorm, SwiGLU, GQA, a window, pre-LN).
It satisfies the CausalLM protocol (model/lm/protocol.py) and is registered as `lm-reference`."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import attend
from model.cache import KVCache
from model.init import NORMAL_STD
from model.layers import sinusoidal_table
from model.lm.config import LMConfig, lm_preset
from model.lm.protocol import LMAttentionRecord, default_positions
from model.lm.registry import register_lm
from model.lm.rotary import rotary_angles, rotate


def make_norm(cfg: LMConfig) -> nn.Module:
    """LayerNorm (section 3.1) or RMSNorm (Zhang and Sennrich 2019) over d_model."""
    return nn.LayerNorm(cfg.d_model) if cfg.norm == "layernorm" else nn.RMSNorm(cfg.d_model)


def gelu(x: Tensor) -> Tensor:
    """GELU by its tanh approximation, as GPT-2's code computes it (the gpt2-small preset's activation)."""
    return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    """W2(act(W1 x)): ReLU is eq. (2), GELU GPT-2's; SwiGLU (Shazeer 2020) is W2(silu(W1 x) * W3 x), d_ff wide."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.w_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.w_2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.w_3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.ffn == "swiglu" else None
        self.activation = {"relu": F.relu, "gelu": gelu, "swiglu": F.silu}[cfg.ffn]

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.w_1(x))
        return self.w_2(hidden if self.w_3 is None else hidden * self.w_3(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with n_kv_heads key/value heads (GQA, Ainslie et al. 2023): W_q: d_model -> h*d,
    W_k, W_v: d_model -> h_kv*d, W_o: h*d -> d_model; query head i reads key/value head i // (h / h_kv)."""

    def __init__(self, cfg: LMConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.h, self.h_kv, self.d = layer, cfg.n_heads, cfg.kv_heads, cfg.d_head
        self.layout = cfg.rotary_layout
        self.w_q = nn.Linear(cfg.d_model, self.h * self.d, bias=cfg.bias)
        self.w_k = nn.Linear(cfg.d_model, self.h_kv * self.d, bias=cfg.bias)
        self.w_v = nn.Linear(cfg.d_model, self.h_kv * self.d, bias=cfg.bias)
        self.w_o = nn.Linear(self.h * self.d, cfg.d_model, bias=cfg.bias)
        self.records: list[LMAttentionRecord] | None = None  # set while DecoderOnly.attention_records() is open

    def forward(
        self, x: Tensor, allowed: Tensor, rotation: tuple[Tensor, Tensor] | None, cache: KVCache | None
    ) -> Tensor:
        """x (B, T, d_model); allowed (B, 1, T, T_k) over the cached keys and the new ones; rotation the (cos, sin)
        of the new positions (rotary only). The cache keeps keys already rotated."""
        B, T, _ = x.shape
        q = self.w_q(x).view(B, T, self.h, self.d).transpose(1, 2)  # (B, h, T, d)
        k = self.w_k(x).view(B, T, self.h_kv, self.d).transpose(1, 2)  # (B, h_kv, T, d)
        v = self.w_v(x).view(B, T, self.h_kv, self.d).transpose(1, 2)
        if rotation is not None:
            q, k, v = self.positioned(q, k, v, rotation)
        if cache is not None:
            k, v = cache.append(f"self.{self.layer}", k, v)  # (B, h_kv, T_k, d)
        out, probs = self.attend(q, *self.grouped(k, v), allowed, self.records is not None)
        if self.records is not None:  # cached k, v are views of buffers that a later reorder rewrites: copied
            k, v = (k.clone(), v.clone()) if cache is not None else (k, v)
            self.records.append(LMAttentionRecord(self.layer, q, k, v, probs))
        return self.w_o(out.transpose(1, 2).reshape(B, T, -1))

    def positioned(self, q: Tensor, k: Tensor, v: Tensor, rotation: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
        """Queries and keys turned by their positions (RoFormer); the values as they are."""
        return rotate(q, *rotation, self.layout), rotate(k, *rotation, self.layout), v

    def grouped(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values with one head per query head: key/value head j serves query heads j*g .. j*g + g - 1."""
        group = self.h // self.h_kv
        return (k, v) if group == 1 else (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, need_weights: bool):
        """softmax(q k^T / sqrt(d)) v over the allowed keys (model/attention.py, the project's one attention)."""
        return attend(q, k, v, allowed, need_weights)


class Block(nn.Module):
    """Self-attention then the FFN, each with dropout on its output (section 5.4) and a residual connection: post-LN
    x = Norm(x + Sublayer(x)) (section 3.1) or pre-LN x = x + Sublayer(Norm(x)) (Xiong et al. 2020)."""

    def __init__(self, cfg: LMConfig, layer: int, attention: type[SelfAttention] = SelfAttention) -> None:
        super().__init__()
        self.attn, self.ffn = attention(cfg, layer), FeedForward(cfg)
        self.norm_attn, self.norm_ffn = make_norm(cfg), make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.norm_position == "pre"

    def forward(
        self, x: Tensor, allowed: Tensor, rotation: tuple[Tensor, Tensor] | None, cache: KVCache | None
    ) -> Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm_attn(x), allowed, rotation, cache))
            return x + self.dropout(self.ffn(self.norm_ffn(x)))
        x = self.norm_attn(x + self.dropout(self.attn(x, allowed, rotation, cache)))
        return self.norm_ffn(x + self.dropout(self.ffn(x)))


def allowed_keys(pad: Tensor, queries: int, window: int) -> Tensor:
    """(B, 1, T_q, T_k) bool: the last `queries` of the T_k sequence indices may read key j if j is not padding, j <= i
    and, with a window, i - j < window. Causal over the sequence index (the column), not the positions' values."""
    keys = pad.size(1)
    i = torch.arange(keys - queries, keys, device=pad.device)[:, None]  # (T_q, 1)
    j = torch.arange(keys, device=pad.device)  # (T_k,)
    allowed = j <= i
    if window:
        allowed = allowed & (i - j < window)
    return allowed & ~pad[:, None, None, :]


class DecoderOnly(nn.Module):
    """Token embedding (times sqrt(d_model), section 3.4), positions (section 3.5, Table 3 row E, rotary or none),
    n_layers blocks and the pre-softmax linear, tied to the embedding by default."""

    attention: type[SelfAttention] = SelfAttention  # the blocks' self-attention (a subclass changes one step of it)

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.config, self.unsupported = cfg, {}
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "sinusoidal":  # kept in float64 until the model's .to(dtype): exact in a float64 model
            self.register_buffer("sinusoids", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        elif cfg.positions == "learned":
            self.pos_embed = nn.Embedding(cfg.max_len, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer, self.attention) for layer in range(cfg.n_layers))
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()  # post-LN ends normed
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.embed.weight  # one Parameter (section 3.4)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's init (Radford et al. 2019, as its code and HF's GPT-2 draw it): N(0, 0.02) for every linear and
        embedding, zero biases, norms at weight 1 and bias 0. GPT-2's extra 1/sqrt(2 n_layers) on the residual
        projections is left out: the reference stays this shallow."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=NORMAL_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self, ids: Tensor, pad: Tensor, positions: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """Logits (B, T, vocab) for ids (B, T). With a cache, ids are the new tokens and pad (B, T_cached + T) covers
        the cached ones too; positions (B, T) default to `default_positions` of the whole pad."""
        cfg, (B, T) = self.config, ids.shape
        past = cache.length if cache is not None else 0
        if tuple(pad.shape) != (B, past + T):
            raise ValueError(f"pad is {tuple(pad.shape)}, expected (B, cached + new) = ({B}, {past + T})")
        positions = self.positions_of(pad, past) if positions is None else positions
        x = self.embed(ids)  # (B, T, d_model)
        if cfg.scale_embeddings:
            x = x * math.sqrt(cfg.d_model)
        if cfg.positions == "sinusoidal":
            x = x + self.sinusoids[positions].to(x.dtype)
        elif cfg.positions == "learned":
            x = x + self.pos_embed(positions)
        x = self.dropout(x)
        rotation = rotary_angles(positions, cfg.d_head, cfg.rotary_base, x.dtype) if cfg.positions == "rotary" else None
        allowed = self.allowed(pad, T)
        for block in self.blocks:
            x = block(x, allowed, rotation, cache)
        if cache is not None:
            cache.length += T
        return self.output(self.final_norm(x))

    def positions_of(self, pad: Tensor, past: int) -> Tensor:
        """The new tokens' positions when none are given: counted from each row's first real token."""
        return default_positions(pad)[:, past:]

    def allowed(self, pad: Tensor, queries: int) -> Tensor:
        """Which keys the last `queries` positions may read: causal, not padding, within the window."""
        return allowed_keys(pad, queries, self.config.window)

    def new_cache(self) -> KVCache:
        """An empty cache; each layer appends its rotated keys and its values under 'self.{layer}'."""
        return KVCache()

    def reorder_cache(self, cache: KVCache, index: Tensor) -> KVCache:
        """The cache with row r holding what row index[r] held."""
        cache.reorder(index)
        return cache

    @torch.no_grad()
    def generate(self, ids: Tensor, pad: Tensor, steps: int) -> Tensor:
        """`steps` greedy tokens (B, steps) after left-padded prompts, through the cache: plain argmax over every
        logit (as HF's generate without logits processors), no end-of-sentence stop."""
        if steps == 0:
            return ids.new_zeros(ids.size(0), 0)
        cache = self.new_cache()
        token = self(ids, pad, cache=cache)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        tokens = [token]
        while len(tokens) < steps:
            pad = F.pad(pad, (0, 1), value=False)
            token = self(token, pad, cache=cache)[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
        return torch.cat(tokens, 1)

    @contextmanager
    def attention_records(self) -> Iterator[list[LMAttentionRecord]]:
        """While open, each layer's self-attention appends an LMAttentionRecord to the yielded list."""
        records: list[LMAttentionRecord] = []
        for block in self.blocks:
            block.attn.records = records
        try:
            yield records
        finally:
            for block in self.blocks:
                block.attn.records = None

    def embedding_weights(self) -> dict[str, Tensor]:
        """The token embedding and the pre-softmax linear's weight, (vocab, d_model) each (one Parameter if tied)."""
        return {"input": self.embed.weight, "output": self.output.weight}


@register_lm(
    "lm-reference",
    "the reference decoder-only model (the paper's decoder without cross-attention; presets small, modern, gpt2-small)",
    config=lambda variant: lm_preset(variant or "small"),
)
def build(cfg: LMConfig) -> DecoderOnly:
    return DecoderOnly(cfg)
