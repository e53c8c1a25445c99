"""A correct Transformer written here, independently of model/, passes every property of the suite.

It follows the paper (post-LN, sinusoidal PE, shared scaled embeddings, label smoothing) but makes its own
choices where the paper leaves room, as other correct code does: decoder self-attention masks only the
future (padded target keys stay visible to padded queries, whose outputs nothing reads), a query with no
visible key gets uniform probabilities (masked with the dtype's minimum, never zeroed), and embeddings are
initialised with unit scale, so that the base config's softmax saturates.
"""

import math
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from hypothesis import settings
from torch import nn

from invariants import run_suite
from invariants.engine import PASS
from model.attention import AttentionRecord
from model.cache import KVCache
from model.paper_params import DecoderLayer, EncoderLayer, FeedForward, PaperParams, Positions, layer_norm, multi_head

# A spec like any user's: the class is the factory, the spec's own config is small (CI), drawn configs are smaller.
SPEC = "tests.invariants.test_independent:Independent,N=2,d_model=32,h=4,d_k=8,d_v=8,d_ff=64,vocab_size=60"


class Attention(nn.Module):
    def __init__(self, cfg, kind):
        super().__init__()
        self.cfg, self.kind = cfg, kind
        self.q, self.k = nn.Linear(cfg.d_model, cfg.h * cfg.d_k), nn.Linear(cfg.d_model, cfg.h * cfg.d_k)
        self.v, self.o = nn.Linear(cfg.d_model, cfg.h * cfg.d_v), nn.Linear(cfg.h * cfg.d_v, cfg.d_model)

    def forward(self, x, source, visible, owner, layer, past=None):
        B, h = x.size(0), self.cfg.h
        split = lambda t: t.view(B, t.size(1), h, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(source)), split(self.v(source))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.cfg.d_k)
        probs = torch.softmax(scores.masked_fill(~visible, torch.finfo(scores.dtype).min), -1)
        if owner.records is not None:
            owner.records.append(AttentionRecord(self.kind, layer, probs))
        out = torch.einsum("bhqk,bhkd->bhqd", probs, v).transpose(1, 2).reshape(B, x.size(1), -1)
        return self.o(out), (k, v)


class Independent(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config, self.unsupported, self.records, self.use_pe = cfg, {}, None, True
        d, N = cfg.d_model, cfg.N
        self.src_tokens = nn.Parameter(torch.randn(cfg.vocab_size, d))
        self.tgt_tokens = self.src_tokens if cfg.share_embeddings else nn.Parameter(torch.randn(cfg.vocab_size, d))
        self.out_tokens = self.tgt_tokens if cfg.share_embeddings else nn.Parameter(torch.randn(cfg.vocab_size, d) / d)
        position = torch.arange(cfg.max_len, dtype=torch.float64)[:, None]
        angle = position * torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
        table = torch.zeros(cfg.max_len, d, dtype=torch.float64)
        table[:, 0::2], table[:, 1::2] = angle.sin(), angle.cos()
        if cfg.pe == "learned":
            self.learned_pe = nn.Parameter(torch.randn(cfg.max_len, d) * 0.1)
        self.register_buffer("pe", table.float(), persistent=False)

        def block(kinds):
            return nn.ModuleDict(
                {k: Attention(cfg, k) for k in kinds}
                | {
                    "ff1": nn.Linear(d, cfg.d_ff),
                    "ff2": nn.Linear(cfg.d_ff, d),
                    "norms": nn.ModuleList(nn.LayerNorm(d) for _ in range(len(kinds) + 1)),
                }
            )

        self.enc = nn.ModuleList(block(["encoder_self"]) for _ in range(N))
        self.dec = nn.ModuleList(block(["decoder_self", "cross"]) for _ in range(N))

    def _drop(self, x):
        return F.dropout(x, self.config.P_drop, self.training)

    def _positions(self, x, start=0):
        if not self.use_pe or self.config.pe == "none":
            return x
        return x + self.positional_table(start + x.size(1))[start:].to(x.dtype)

    def _ffn(self, blk, x):
        return blk["norms"][-1](x + self._drop(blk["ff2"](torch.relu(blk["ff1"](x)))))

    def embed(self, ids):
        return self.tgt_tokens[ids] * math.sqrt(self.config.d_model)

    def encode(self, src, src_pad):
        x = src if src.is_floating_point() else self.src_tokens[src] * math.sqrt(self.config.d_model)
        x = self._drop(self._positions(x))
        visible = ~src_pad[:, None, None, :]
        for i, blk in enumerate(self.enc):
            x = blk["norms"][0](x + self._drop(blk["encoder_self"](x, x, visible, self, i)[0]))
            x = self._ffn(blk, x)
        return x

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        start = cache.length if cache is not None else 0
        x = self._drop(self._positions(tgt if tgt.is_floating_point() else self.embed(tgt), start))
        T = x.size(1)
        future_hidden = torch.arange(start + T)[None, :] <= torch.arange(start, start + T)[:, None]  # only the future
        for i, blk in enumerate(self.dec):
            past = cache.kv.get(f"self{i}") if cache is not None else None
            attended, kv = blk["decoder_self"](x, x, future_hidden, self, i, past)
            if cache is not None:
                cache.kv[f"self{i}"] = kv
            x = blk["norms"][0](x + self._drop(attended))
            x = blk["norms"][1](x + self._drop(blk["cross"](x, memory, ~src_pad[:, None, None, :], self, i)[0]))
            x = self._ffn(blk, x)
        if cache is not None:
            cache.length += T
        return x @ self.out_tokens.T

    def forward(self, src, tgt, src_pad, tgt_pad):
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits, target):
        log_p = torch.log_softmax(logits, -1)
        per_token = -(1 - self.config.eps_ls) * log_p.gather(-1, target[..., None])[
            ..., 0
        ] - self.config.eps_ls * log_p.mean(-1)
        keep = target != self.config.pad_id
        return per_token[keep].sum() / keep.sum()

    def new_cache(self):
        return KVCache()

    @contextmanager
    def attention_probs(self):
        self.records = []
        try:
            yield self.records
        finally:
            self.records = None

    def positional_table(self, positions):
        return self.learned_pe[:positions] if self.config.pe == "learned" else self.pe[:positions]

    @contextmanager
    def positional_encoding(self, enabled):
        before, self.use_pe = self.use_pe, enabled
        try:
            yield
        finally:
            self.use_pe = before

    def embedding_weights(self):
        return {"source": self.src_tokens, "target": self.tgt_tokens, "generator": self.out_tokens}

    def paper_params(self):
        """Its weights in the paper's layout (model/paper_params.py), from their own names: q, k, v, o per attention,
        ff1 and ff2 (eq. 2), a LayerNorm after each sub-layer."""
        h = self.config.h

        def mha(a):
            return multi_head(
                a.q.weight, a.k.weight, a.v.weight, a.o.weight, h, (a.q.bias, a.k.bias, a.v.bias, a.o.bias)
            )

        def ffn(blk):
            return FeedForward(blk["ff1"].weight.T, blk["ff1"].bias, blk["ff2"].weight.T, blk["ff2"].bias)

        norm = (
            [[layer_norm(n) for n in blk["norms"]] for blk in self.enc],
            [[layer_norm(n) for n in blk["norms"]] for blk in self.dec],
        )
        table = None if self.config.pe == "none" else self.positional_table(self.config.max_len)
        return PaperParams(
            self.src_tokens,
            self.tgt_tokens,
            self.out_tokens,
            Positions(self.config.pe, table, table),
            tuple(EncoderLayer(mha(b["encoder_self"]), n[0], ffn(b), n[1]) for b, n in zip(self.enc, norm[0])),
            tuple(
                DecoderLayer(mha(b["decoder_self"]), n[0], mha(b["cross"]), n[1], ffn(b), n[2])
                for b, n in zip(self.dec, norm[1])
            ),
        )

    def parameter_groups(self):
        embeddings = list({id(p): p for p in (self.src_tokens, self.tgt_tokens, self.out_tokens)}.values())
        return {
            "embeddings": embeddings + ([self.learned_pe] if self.config.pe == "learned" else []),
            "encoder": list(self.enc.parameters()),
            "decoder": list(self.dec.parameters()),
        }


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_independent_correct_transformer_passes_every_property():
    results = run_suite(SPEC, settings=settings(settings.default, max_examples=3))
    not_passed = [f"{r.name}: {r.verdict} {r.reason}" for r in results if r.verdict != PASS]
    assert not not_passed, not_passed
