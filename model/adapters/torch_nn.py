"""torch.nn.Transformer, wrapped with a shared scaled embedding, sinusoidal PE and a tied generator.

It runs the harness on code nobody here wrote. Differences from the paper that stay visible in the
checks: torch adds a final LayerNorm after the encoder and after the decoder, and has no KV cache.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from model.attention import AttentionRecord, KVCache
from model.config import TransformerConfig
from model.init import initialise
from model.layers import PositionalEncoding, embedding_scale
from model.objective import label_smoothed_loss
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

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        return {
            "embeddings": [self.embedding.weight, *self.pe.parameters()],
            "encoder": list(self.core.encoder.parameters()),
            "decoder": list(self.core.decoder.parameters()),
        }


@register_model("torch-nn", "torch.nn.Transformer with the paper's embeddings and PE")
def build(config: TransformerConfig) -> TorchTransformer:
    return TorchTransformer(config)
