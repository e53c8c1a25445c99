"""torch.nn.Transformer, wrapped with a shared scaled embedding, sinusoidal PE and a tied generator.

It runs the harness on code nobody here wrote. Differences from the paper that stay visible in the
checks: torch adds a final LayerNorm after the encoder and after the decoder, and has no KV cache.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace
from typing import Iterator

import torch
from torch import Tensor, nn

from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
from model.init import initialise
from model.layers import PositionalEncoding, embedding_scale
from model.objective import label_smoothed_loss
from model.paper_params import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    PaperParams,
    Positions,
    extras,
    layer_norm,
    multi_head,
    sublayer_recorder,
)
from model.registry import register_model


class TorchTransformer(nn.Module):
    """The protocol around torch.nn.Transformer (post-LN, ReLU, batch_first)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if cfg.h * cfg.d_k != cfg.d_model or cfg.h * cfg.d_v != cfg.d_model:
            raise ValueError(
                f"torch.nn.Transformer needs h*d_k == h*d_v == d_model; got h={cfg.h}, d_k={cfg.d_k}, d_v={cfg.d_v}, d_model={cfg.d_model}"
            )
        if not cfg.share_embeddings:
            raise ValueError("the torch adapter always shares its embeddings; set share_embeddings=true")
        self.config = cfg
        self.unsupported = {"kv_cache": "torch.nn.Transformer has no incremental decoding"}
        if cfg.pe == "none":
            self.unsupported["positional_table"] = "pe='none'"
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pe = PositionalEncoding(cfg)
        self.dropout = nn.Dropout(cfg.P_drop)
        self.core = nn.Transformer(
            d_model=cfg.d_model,
            nhead=cfg.h,
            num_encoder_layers=cfg.N,
            num_decoder_layers=cfg.N,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.P_drop,
            batch_first=True,
            norm_first=False,
        )
        initialise([self.embedding.weight, *self._matrices()], [self.embedding.weight], cfg)

    def _matrices(self) -> list[Tensor]:
        """Every linear map's weight, drawn by the config's rule: torch fuses the query, key and value maps into one
        in_proj_weight (3 d_model x d_model), whose three blocks are drawn each as the d_model x d_model map it is."""
        matrices = []
        for m in self.core.modules():
            if isinstance(m, nn.MultiheadAttention):
                with torch.no_grad():
                    matrices += list(m.in_proj_weight.view(3, m.embed_dim, m.embed_dim).unbind(0))
            elif isinstance(m, nn.Linear):
                matrices.append(m.weight)
        return matrices

    def embed(self, ids: Tensor) -> Tensor:
        return self.embedding(ids) * embedding_scale(self.config.d_model)

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        x = self.dropout(self.pe(src if src.is_floating_point() else self.embed(src)))
        return self.core.encoder(x, src_key_padding_mask=src_pad)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        if cache is not None:
            raise NotImplementedError(self.unsupported["kv_cache"])
        x = tgt if tgt.is_floating_point() else self.embed(tgt)
        x = self.dropout(self.pe(x))
        T = x.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)  # True = masked
        out = self.core.decoder(
            x,
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return out @ self.embedding.weight.T  # tied pre-softmax linear

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return label_smoothed_loss(logits, target, self.config.pad_id, self.config.eps_ls)

    def new_cache(self) -> KVCache:
        raise NotImplementedError(self.unsupported["kv_cache"])

    def _attention_modules(self) -> Iterator[tuple[str, int, nn.MultiheadAttention]]:
        for i, layer in enumerate(self.core.encoder.layers):
            yield "encoder_self", i, layer.self_attn
        for i, layer in enumerate(self.core.decoder.layers):
            yield "decoder_self", i, layer.self_attn
            yield "cross", i, layer.multihead_attn

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        """Asks every nn.MultiheadAttention for per-head weights, the path on which torch's own bugs hid."""
        records: list[AttentionRecord] = []

        def request_weights(module, args, kwargs):
            return args, {**kwargs, "need_weights": True, "average_attn_weights": False}

        def keep(kind: str, layer: int):
            return lambda module, args, kwargs, out: records.append(AttentionRecord(kind, layer, out[1]))

        with ExitStack() as stack:
            fastpath = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)  # the fused path never calls the modules
            stack.callback(torch.backends.mha.set_fastpath_enabled, fastpath)
            for kind, layer, mha in self._attention_modules():
                stack.callback(mha.register_forward_pre_hook(request_weights, with_kwargs=True).remove)
                stack.callback(mha.register_forward_hook(keep(kind, layer), with_kwargs=True).remove)
            yield records

    def positional_table(self, positions: int) -> Tensor:
        return self.pe.table(positions)

    def positional_encoding(self, enabled: bool) -> AbstractContextManager[None]:
        return self.pe.switched(enabled)

    def embedding_weights(self) -> dict[str, Tensor]:
        w = self.embedding.weight
        return {"source": w, "target": w, "generator": w}

    def paper_params(self) -> PaperParams:
        """torch's weights in the paper's layout: in_proj_weight stacks the (out, in) weights of W^Q, W^K, W^V in
        that order (torch.nn.MultiheadAttention); linear1, linear2 are eq. (2)'s maps; norm1..3 follow the sub-layers."""
        h = self.config.h

        def mha(m: nn.MultiheadAttention):
            q, k, v = m.in_proj_weight.chunk(3)
            b = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else (None, None, None)
            return multi_head(q, k, v, m.out_proj.weight, h, (*b, m.out_proj.bias))

        def ffn(layer: nn.Module) -> FeedForward:
            return FeedForward(layer.linear1.weight.T, layer.linear1.bias, layer.linear2.weight.T, layer.linear2.bias)

        table = self.pe.table(self.pe.table_len()) if self.config.pe != "none" else None
        encoder = tuple(
            EncoderLayer(mha(layer.self_attn), layer_norm(layer.norm1), ffn(layer), layer_norm(layer.norm2))
            for layer in self.core.encoder.layers
        )
        decoder = tuple(
            DecoderLayer(
                mha(layer.self_attn),
                layer_norm(layer.norm1),
                mha(layer.multihead_attn),
                layer_norm(layer.norm2),
                ffn(layer),
                layer_norm(layer.norm3),
            )
            for layer in self.core.decoder.layers
        )
        w = self.embedding.weight
        params = PaperParams(w, w, w, Positions(self.config.pe, table, table), encoder, decoder)
        return replace(
            params, extras=extras(self, params)
        )  # torch's final LayerNorms, core.encoder.norm and .decoder.norm

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        """Sub-layer outputs by forward hooks on torch's modules (the fused fast path, which calls none, switched off)."""
        hooks: dict[str, tuple[nn.Module, str]] = {}
        for stack in ("encoder", "decoder"):
            layers = getattr(self.core, stack).layers
            hooks[f"{stack}.embedded"] = (layers[0], "input")
            for i, layer in enumerate(layers):
                p = f"{stack}.{i}."
                hooks |= {
                    p + "self_attention.input": (layer.self_attn, "input"),
                    p + "self_attention": (layer.self_attn, "output"),
                }
                hooks |= {p + "norm_1": (layer.norm1, "output"), p + "ffn.input": (layer.linear1, "input")}
                hooks |= {p + "ffn": (layer.linear2, "output"), p + "norm_2": (layer.norm2, "output")}
                if stack == "decoder":
                    a = layer.multihead_attn
                    hooks |= {p + "cross_attention.input": (a, "input"), p + "cross_attention.memory": (a, "memory")}
                    hooks |= {p + "cross_attention": (a, "output"), p + "norm_3": (layer.norm3, "output")}
        hooks["decoder.output"] = (self.core.decoder, "output")
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with sublayer_recorder(hooks) as recorded:
                recorded["encoder.output"] = memory = self.encode(src, src_pad)
                recorded["logits"] = self.decode(tgt, memory, src_pad, tgt_pad)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
        return recorded

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        return {
            "embeddings": [self.embedding.weight, *self.pe.parameters()],
            "encoder": list(self.core.encoder.parameters()),
            "decoder": list(self.core.decoder.parameters()),
        }


@register_model("torch-nn", "torch.nn.Transformer with the paper's embeddings and PE")
def build(config: TransformerConfig) -> TorchTransformer:
    return TorchTransformer(config)
