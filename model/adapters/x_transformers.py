"""lucidrains' x-transformers (PyPI `x-transformers`, tested at 2.31.10) behind the protocol: `x-transformers`.

x-transformers is a library of Transformer variants driven by keyword options. Its `XTransformer` cannot tie the
pre-softmax linear to the embeddings (only num_tokens, max_seq_len, emb_dropout and the position options reach the
decoder's TransformerWrapper, x_transformers/x_transformers.py:4735-4738), so this adapter builds by hand what
XTransformer builds (x_transformers.py:4713-4758): an Encoder and a Decoder(cross_attend=True) each in a
TransformerWrapper, the token embedding shared as XTransformer's tie_token_emb does (x_transformers.py:4754), and
the options nearest the paper: pre_norm=False (post-LN), scaled_sinu_pos_emb=True (its only sinusoids), a ReLU FFN
(ff_custom_activation) of width d_ff, attn_dim_head=d_k, attn_value_dim_head=d_v, norm_add_unit_offset=False (the
gain is the LayerNorm's gain), tie_embedding=True with tie_embedding_scale=1, and dropout P_drop only where section
5.4 puts it (emb_dropout, attn_sublayer_dropout, ff_sublayer_dropout; none on the attention weights or inside the
FFN), attn_project_out=True. Their defaults depart further: pre-LN, learned positions, GELU (x_transformers.py:1801),
logits of a tied head times d_model^-0.5 (:4157), no W^O when h=1 (:2237). Departures from the paper that no option
removes, all visible in the checks (paths in x_transformers/):

- token embeddings enter unscaled, E[x], not E[x] sqrt(d_model) (x_transformers.py:405, :4295), section 3.4;
- its sinusoids are sin|cos halves, not interleaved (x_transformers.py:471), times a learned scalar that starts at
  d_model^-0.5 (x_transformers.py:448; frequencies computed in float32, :451), section 3.5's fixed table;
- LayerNorm has a gain and no bias (x_transformers.py:1017-1036), section 3.1 (Ba et al.'s has both);
- the attention softmax runs in float32 whatever the model's dtype (x_transformers/attend.py:262);
- the library's own loss (autoregressive_wrapper.py:603) has no label smoothing (section 5.4); `loss` here is the
  harness's label-smoothed one, as in the other adapters.

Also: the tie is a lambda closing over the wrapper (x_transformers.py:4158), which copy.deepcopy does not rebind (a copy
would read the original's embedding); the adapter installs the same expression as a bound method, which deepcopy
rebinds. The KV cache is the library's own (LayerIntermediates, advanced with input_not_include_cache and
cache_age); its beam reorder, modify_cached_kv (autoregressive_wrapper.py:55), reorders self-attention entries only,
so `reorder` here reorders every entry.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from dataclasses import replace
from fractions import Fraction
from functools import partial
from typing import Iterator

import torch
from torch import Tensor, nn
from x_transformers import Decoder, Encoder, TransformerWrapper  # (ImportError: pip install x-transformers)
from x_transformers.x_transformers import FeedForward, LayerIntermediates

from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
from model.init import initialise
from model.objective import label_smoothed_loss
from model.paper_params import (
    DecoderLayer,
    EncoderLayer,
    PaperParams,
    Positions,
    extras,
    multi_head,
    sublayer_recorder,
)
from model.paper_params import FeedForward as PaperFFN
from model.paper_params import LayerNorm as PaperLayerNorm
from model.registry import register_model


def _tied_logits(wrapper: TransformerWrapper, t: Tensor) -> Tensor:
    """x_transformers.py:4158's tied head, as a method of the wrapper (so that deepcopy binds it to the copy)."""
    return (t @ wrapper.token_emb.emb.weight.t()) * wrapper.tie_embedding_scale


class XCache(KVCache):
    """The protocol's cache around x-transformers' own: the LayerIntermediates its decoder returns (None before the
    first call), whose attention intermediates hold each self- and cross-attention's cached_kv."""

    def __init__(self) -> None:
        super().__init__()
        self.past: LayerIntermediates | None = None

    def reorder(self, index: Tensor) -> None:
        if self.past is not None:
            for inter in self.past.attn_intermediates:  # self- and cross-attention alike (beams = 1)
                inter.cached_kv = [t.index_select(0, index) for t in inter.cached_kv]


class XTransformerSeq2Seq(nn.Module):
    """An x-transformers Encoder and Decoder, each in a TransformerWrapper, with the protocol's methods."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if cfg.d_model % 2 and cfg.pe == "sinusoidal":
            raise ValueError(f"x-transformers' sinusoids need an even d_model; got d_model={cfg.d_model}")
        self.config, self.unsupported = cfg, {}
        if cfg.pe == "none":
            self.unsupported["positional_table"] = "pe='none': no positional encoding"
        layers = dict(
            dim=cfg.d_model,
            depth=cfg.N,
            heads=cfg.h,
            pre_norm=False,  # post-LN: LayerNorm(x + sublayer(x)), x_transformers.py:3303, :3729
            norm_add_unit_offset=False,  # the gain is stored as the gain, not as gain - 1
            attn_dim_head=cfg.d_k,
            attn_value_dim_head=cfg.d_v,
            attn_project_out=True,  # W^O also at h=1 (row A1), which the default leaves out (x_transformers.py:2237)
            attn_dropout=0.0,  # no dropout on the attention weights (section 5.4 has none there)
            attn_sublayer_dropout=cfg.P_drop,  # on each sub-layer's output, before the residual sum
            ff_mult=Fraction(cfg.d_ff, cfg.d_model),  # inner width int(d_model * mult) = d_ff exactly
            ff_custom_activation=nn.ReLU(),
            ff_dropout=0.0,
            ff_sublayer_dropout=cfg.P_drop,
            verbose=False,
        )
        stacks = dict(
            num_tokens=cfg.vocab_size,
            max_seq_len=cfg.max_len,
            emb_dropout=cfg.P_drop,  # on the sums of embeddings and positions
            use_abs_pos_emb=cfg.pe != "none",
            scaled_sinu_pos_emb=cfg.pe == "sinusoidal",  # else 'learned': AbsolutePositionalEmbedding
        )
        self.enc = TransformerWrapper(**stacks, return_only_embed=True, attn_layers=Encoder(**layers))
        self.dec = TransformerWrapper(
            **stacks,
            tie_embedding=cfg.share_embeddings,
            tie_embedding_scale=1.0,  # the paper's pre-softmax is x E^T; the library's default scales by d^-0.5
            attn_layers=Decoder(cross_attend=True, **layers),
        )
        if cfg.share_embeddings:
            self.dec.token_emb = self.enc.token_emb  # as XTransformer(tie_token_emb=True)
            self.dec.to_logits = types.MethodType(_tied_logits, self.dec)
        tokens = list({id(w.token_emb): w.token_emb.emb.weight for w in (self.enc, self.dec)}.values())
        linears = [m.weight for m in self.modules() if isinstance(m, nn.Linear)]
        initialise([*tokens, *linears], tokens, cfg)
        self._records: list[AttentionRecord] | None = None
        self._positions_on = True
        if cfg.pe != "none":
            for w in (self.enc, self.dec):
                w.pos_emb.register_forward_hook(self._positions)
        # hooks are bound methods (partials of them), which copy.deepcopy rebinds to the copy; closures it would not
        for kind_self, wrapper in (("encoder_self", self.enc), ("decoder_self", self.dec)):
            for i, subs in enumerate(self._blocks(wrapper)):
                for kind, block, _ in subs:
                    if kind in ("a", "c"):
                        block.register_forward_hook(partial(self._record, kind_self if kind == "a" else "cross", i))

    def _positions(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return output if self._positions_on else torch.zeros_like(output)

    def _record(self, kind: str, layer: int, module: nn.Module, args: tuple, output: tuple) -> None:
        if self._records is not None:  # Attention returns (out, Intermediates) to AttentionLayers
            self._records.append(AttentionRecord(kind, layer, output[1].post_softmax_attn))

    # -- the protocol ----------------------------------------------------------------------------------------

    @staticmethod
    def _ids_and_kwargs(x: Tensor) -> tuple[Tensor, dict]:
        """Ids go in as they are; float embeddings replace the token embeddings through the wrapper's own
        transform_token_embeds hook (x_transformers.py:4287), positions still added after them."""
        if not x.is_floating_point():
            return x, {}
        ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        return ids, {"transform_token_embeds": lambda _: x}

    def embed(self, ids: Tensor) -> Tensor:
        return self.dec.token_emb(ids)  # unscaled: what the library feeds its layers (x_transformers.py:4295)

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        ids, kwargs = self._ids_and_kwargs(src)
        return self.enc(ids, mask=~src_pad, return_embeddings=True, **kwargs)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        ids, kwargs = self._ids_and_kwargs(tgt)
        if cache is None:
            return self.dec(ids, mask=~tgt_pad, context=memory, context_mask=~src_pad, **kwargs)
        if cache.past is not None:  # later calls: only the new positions, offset by the cache's length
            kwargs |= dict(cache=cache.past, input_not_include_cache=True, cache_age=ids.size(1))
        logits, cache.past = self.dec(ids, context=memory, context_mask=~src_pad, return_intermediates=True, **kwargs)
        cache.length += ids.size(1)
        return logits

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return label_smoothed_loss(logits, target, self.config.pad_id, self.config.eps_ls)

    def new_cache(self) -> XCache:
        return XCache()

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        """Attend always computes the explicit softmax (flash is off) and returns it in its intermediates."""
        records: list[AttentionRecord] = []
        before, self._records = self._records, records
        try:
            yield records
        finally:
            self._records = before

    def _table(self, wrapper: TransformerWrapper, positions: int) -> Tensor:
        """What the stack adds at positions 0.., computed by its own module (the switch left aside)."""
        ref = next(self.parameters())
        with self.positional_encoding(True):
            return wrapper.pos_emb(torch.zeros(1, positions, device=ref.device, dtype=ref.dtype))

    def positional_table(self, positions: int) -> Tensor:
        if self.config.pe == "none":
            raise NotImplementedError(self.unsupported["positional_table"])
        with torch.no_grad():
            return self._table(self.enc, positions)  # the decoder's starts equal (its own learned scale)

    @contextmanager
    def positional_encoding(self, enabled: bool) -> Iterator[None]:
        before, self._positions_on = self._positions_on, enabled
        try:
            yield
        finally:
            self._positions_on = before

    def embedding_weights(self) -> dict[str, Tensor]:
        generator = self.dec.token_emb.emb.weight if self.config.share_embeddings else self.dec.to_logits.weight
        return {
            "source": self.enc.token_emb.emb.weight,
            "target": self.dec.token_emb.emb.weight,
            "generator": generator,
        }

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        embeddings = {
            id(p): p
            for w in (self.enc, self.dec)
            for m in (w.token_emb, w.pos_emb)
            if isinstance(m, nn.Module)
            for p in m.parameters()
        }
        groups = {
            "embeddings": list(embeddings.values()),
            "encoder": list(self.enc.attn_layers.parameters()),
            "decoder": list(self.dec.attn_layers.parameters()),
        }
        if not self.config.share_embeddings:
            groups["generator"] = list(self.dec.to_logits.parameters())
        return groups

    # -- the paper's layout --------------------------------------------------------------------------------------

    @staticmethod
    def _blocks(wrapper: TransformerWrapper) -> list[list[tuple[str, nn.Module, nn.Module]]]:
        """Per layer, (type, block, its post-LN norm) for each sub-layer, in order: 'a', ('c'), 'f'."""
        al = wrapper.attn_layers
        per = al.len_default_block
        subs = [(t, block, norms[2]) for t, (norms, block, _) in zip(al.layer_types, al.layers)]
        return [subs[i : i + per] for i in range(0, len(subs), per)]

    def paper_params(self) -> PaperParams:
        """to_q, to_k, to_v, to_out (bias-free, heads packed 'b n (h d)', x_transformers.py:2019) are W^Q, W^K, W^V,
        W^O; ff[0][0] and ff[-1] (Linear, ReLU | Dropout | Linear) are eq. (2)'s; norms[2] is the LayerNorm after each
        sub-layer, its gain `gamma` and no bias."""
        h = self.config.h
        mha = lambda a: multi_head(a.to_q.weight, a.to_k.weight, a.to_v.weight, a.to_out.weight, h)  # noqa: E731

        def ffn(f: FeedForward) -> PaperFFN:
            w1, w2 = f.ff[0][0], [m for m in f.ff if isinstance(m, nn.Linear)][-1]
            return PaperFFN(w1.weight.T, w1.bias, w2.weight.T, w2.bias)

        def norm(n: nn.Module) -> PaperLayerNorm:
            return PaperLayerNorm(n.gamma, None, float(n.ln.eps))

        encoder = tuple(
            EncoderLayer(mha(a), norm(na), ffn(f), norm(nf)) for (_, a, na), (_, f, nf) in self._blocks(self.enc)
        )
        decoder = tuple(
            DecoderLayer(mha(a), norm(na), mha(c), norm(nc), ffn(f), norm(nf))
            for (_, a, na), (_, c, nc), (_, f, nf) in self._blocks(self.dec)
        )
        if self.config.pe == "none":
            positions = Positions("none")
        else:
            n = self.config.max_len
            with torch.no_grad():
                positions = Positions(self.config.pe, self._table(self.enc, n), self._table(self.dec, n))
        w = self.embedding_weights()
        params = PaperParams(w["source"], w["target"], w["generator"], positions, encoder, decoder)
        return replace(params, extras=extras(self, params))  # the learned PE scales (or tables)

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        hooks: dict[str, tuple[nn.Module, str]] = {}
        for stack, wrapper in (("encoder", self.enc), ("decoder", self.dec)):
            hooks[f"{stack}.embedded"] = (wrapper.attn_layers, "input")
            for i, subs in enumerate(self._blocks(wrapper)):
                for j, (kind, block, post_norm) in enumerate(subs):
                    name = {"a": "self_attention", "c": "cross_attention", "f": "ffn"}[kind]
                    p = f"{stack}.{i}."
                    hooks |= {p + name + ".input": (block, "input"), p + name: (block, "output")}
                    hooks[p + f"norm_{j + 1}"] = (post_norm, "output")
        hooks["decoder.output"] = (self.dec.attn_layers, "output")
        with sublayer_recorder(hooks) as recorded:
            recorded["encoder.output"] = memory = self.encode(src, src_pad)
            recorded["logits"] = self.decode(tgt, memory, src_pad, tgt_pad)
        return recorded


@register_model("x-transformers", "lucidrains' x-transformers Encoder/Decoder, post-LN, ReLU, sinusoids, tied")
def build(config: TransformerConfig) -> XTransformerSeq2Seq:
    return XTransformerSeq2Seq(config)
