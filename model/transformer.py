"""The reference encoder-decoder (section 3), assembled from replaceable parts as in the Annotated Transformer.

`Parts` holds the seams where a check's mutant swaps one piece (the attention function, the causal
mask, the positional table, the norm, ...). The reference model uses the defaults, which follow the paper.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch import Tensor, nn

from model.attention import (
    Attend,
    AttentionRecord,
    MultiHeadAttention,
    attend,
    causal_kernel_applies,
    causal_mask,
)
from model.cache import KVCache
from model.config import TransformerConfig
from model.init import initialise
from model.layers import (
    DecoderLayer,
    DropoutFactory,
    EncoderLayer,
    NormFactory,
    PositionalEncoding,
    PositionTable,
    embedding_scale,
    sinusoidal_table,
)
from model.objective import label_smoothed_loss, linear_label_smoothed_loss
from model.paper_params import PaperParams, export_paper_params, reference_sublayers

HALF = (torch.bfloat16, torch.float16)


def key_padding_allowed(pad: Tensor) -> Tensor:
    """(B, 1, 1, T_k) bool: every query may see every non-pad key."""
    return ~pad[:, None, None, :]


def within_pairs(allowed: Tensor, queries: Tensor | None, keys: Tensor | None) -> Tensor:
    """`allowed` narrowed, in a packed batch (segment ids (B, T_q) and (B, T_k); None: unpacked, left as it is), to
    (B, 1, T_q, T_k): a query sees the keys of its own pair alone; a padding query (segment 0) sees what it sees
    unpacked, so that no query of a row is left with no key to see."""
    if queries is None or keys is None:
        return allowed
    return allowed & ((queries[:, None, :, None] == keys[:, None, None, :]) | (queries == 0)[:, None, :, None])


def positions_within(segments: Tensor) -> Tensor:
    """(B, T): each position's index within its pair, so that section 3.5's positions restart at each packed pair;
    its index minus that of its pair's first position, found on the device (a running maximum of the starts)."""
    index = torch.arange(segments.size(1), device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    return index - torch.where(starts, index, 0).cummax(1).values


@dataclass(frozen=True)
class Parts:
    """Replaceable pieces of the model; the defaults are the paper's."""

    attend: Attend = attend
    causal_mask: Callable[..., Tensor] = causal_mask
    key_mask: Callable[[Tensor], Tensor] = key_padding_allowed
    position_table: PositionTable = sinusoidal_table
    norm: NormFactory = nn.LayerNorm
    dropout: DropoutFactory = nn.Dropout
    tie_embeddings: bool = True  # honoured where config.share_embeddings
    embed_scale: Callable[[int], float] = embedding_scale  # d_model -> the factor on token embeddings
    loss: Callable[[Tensor, Tensor, int, float], Tensor] = label_smoothed_loss


class Transformer(nn.Module):
    """Encoder-decoder with one embedding matrix shared by source, target and the pre-softmax linear."""

    beams_share_memory = True  # with new_cache(beams), decode takes the memory once per sentence for its beams' rows

    def __init__(self, cfg: TransformerConfig, parts: Parts = Parts()) -> None:
        super().__init__()
        self.config, self.parts = cfg, parts
        self.unsupported = {"positional_table": "pe='none'"} if cfg.pe == "none" else {}
        tie = cfg.share_embeddings and parts.tie_embeddings
        self.src_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.tgt_embed = self.src_embed if tie else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.pe = PositionalEncoding(cfg, parts.position_table)
        self.dropout = parts.dropout(cfg.P_drop)
        self.encoder = nn.ModuleList(
            EncoderLayer(cfg, i, parts.attend, parts.norm, parts.dropout) for i in range(cfg.N)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(cfg, i, parts.attend, parts.norm, parts.dropout) for i in range(cfg.N)
        )
        self._init_weights()
        if tie:
            self.generator.weight = self.src_embed.weight

    def _init_weights(self) -> None:
        """Matrices and token embeddings by config.init (model/init.py), zero biases; a learned PE keeps N(0, 1)."""
        tokens = [self.src_embed.weight, self.tgt_embed.weight]
        linears = [m for m in self.modules() if isinstance(m, nn.Linear)]
        weights = [
            m.weight for m in self.modules() if isinstance(m, nn.Linear) or m in (self.src_embed, self.tgt_embed)
        ]
        initialise(list({id(w): w for w in weights}.values()), tokens, self.config)
        for m in linears:
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    # -- the forward computation ---------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        return self.tgt_embed(ids) * self.parts.embed_scale(self.config.d_model)

    def encode(self, src: Tensor, src_pad: Tensor, segments: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """src is ids (B, S) or source embeddings already scaled (B, S, d_model), as decode takes tgt; `segments`,
        a packed batch's (source, target) segment ids (model/batch.py)."""
        x = src if src.is_floating_point() else self.src_embed(src) * self.parts.embed_scale(self.config.d_model)
        src_seg = segments[0] if segments is not None else None
        x = self.dropout(self.pe(x) if src_seg is None else self.pe(x, positions=positions_within(src_seg)))
        allowed = within_pairs(self.parts.key_mask(src_pad), src_seg, src_seg)
        for layer in self.encoder:
            x = layer(x, allowed)
        return x

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_pad: Tensor,
        tgt_pad: Tensor,
        cache: KVCache | None = None,
        segments: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """With a cache, tgt holds only new positions; earlier target keys are taken as non-pad (right padding).
        `segments`: a packed batch's (source, target) segment ids, in training (never with a cache)."""
        return self.generator(self.decoded(tgt, memory, src_pad, tgt_pad, cache, segments))

    def decoded(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_pad: Tensor,
        tgt_pad: Tensor,
        cache: KVCache | None = None,
        segments: tuple[Tensor, Tensor] | None = None,
        right_padded: bool = False,
    ) -> Tensor:
        """The decoder stack's output (B, T, d_model), the input of the pre-softmax linear. `right_padded`: the caller
        knows that every row's padding follows its tokens (`Batch.right_padded`), which `causal_by_kernel` may use."""
        offset = cache.length if cache is not None else 0
        fixed = cache is not None and cache.position is not None  # `KVCache.fix_shapes`: the position on the device
        src_seg, tgt_seg = segments if segments is not None else (None, None)
        x = tgt if tgt.is_floating_point() else self.embed(tgt)
        B, T = x.shape[:2]
        if fixed:
            x = self.dropout(self.pe(x, positions=cache.positions(T).expand(B, T)))
        else:
            x = self.dropout(self.pe(x, offset) if tgt_seg is None else self.pe(x, positions=positions_within(tgt_seg)))
        if right_padded and segments is None and cache is None and self.causal_by_kernel(x):
            self_allowed = None  # `attend`'s causal kernel
        elif fixed:  # every reserved position is a key: those after each query's own are masked
            self_allowed = self.parts.causal_mask(T, cache.capacity, cache.position, x.device)
        else:
            self_allowed = self.parts.causal_mask(T, offset + T, offset, x.device)
            if cache is None:
                self_allowed = within_pairs(self_allowed & self.parts.key_mask(tgt_pad), tgt_seg, tgt_seg)
        cross_allowed = within_pairs(self.parts.key_mask(src_pad), tgt_seg, src_seg)
        for layer in self.decoder:
            x = layer(x, memory, self_allowed, cross_allowed, cache)
        if cache is not None:
            cache.length += T
        return x

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_pad: Tensor,
        tgt_pad: Tensor,
        labels: Tensor | None = None,
        segments: tuple[Tensor, Tensor] | None = None,
        right_padded: bool = False,
    ) -> Tensor:
        """The logits (B, T, vocab); given the labels, the training loss `loss(logits, labels)` instead, by
        `linear_label_smoothed_loss`, which never holds all the logits at once (called here, not in a method of its
        own, so that torch.compile breaks the graph once, after the decoder, and compiles one graph).

        `segments`, a packed batch's (source, target) segment ids: each pair is computed as it would be alone in its
        row (`within_pairs`, `positions_within`); encode and decode are called without them where there are none.
        `right_padded`: every target row's padding follows its tokens (training's batches), see `causal_by_kernel`."""
        packed = {"segments": segments} if segments is not None else {}
        memory = self.encode(src, src_pad, **packed)
        if labels is None:
            return self.decode(tgt, memory, src_pad, tgt_pad, **packed)
        if not self.loss_is_chunked():
            logits = self.decode(tgt, memory, src_pad, tgt_pad, **packed)
            return self.loss(logits.float() if logits.dtype in HALF else logits, labels)  # fp32 under autocast
        decoded = self.decoded(tgt, memory, src_pad, tgt_pad, right_padded=right_padded, **packed)
        return linear_label_smoothed_loss(
            decoded, self.generator.weight, labels, self.config.pad_id, self.config.eps_ls
        )

    def causal_by_kernel(self, x: Tensor) -> bool:
        """Whether the decoder's self-attention over a right-padded, unpacked target may be the causal kernel with no
        mask: on a GPU, where it is faster. Exact where it matters: a real query's earlier keys are all real, and a
        padding query's output reaches neither a real position nor the loss (its label is padding). Not in a model
        whose causal mask, attention function or attention module a check replaced."""
        return causal_kernel_applies(x) and self._attention_as_written(layer.self_attn for layer in self.decoder)

    def _attention_as_written(self, modules: Iterable[nn.Module]) -> bool:
        """Whether the causal mask, the attention function and these attention modules are the reference's: no check
        replaced them (a mutant), so that a faster path that bypasses them computes what they would."""
        return (
            self.parts.causal_mask is causal_mask
            and self.parts.attend is attend
            and all(type(m) is MultiHeadAttention for m in modules)
        )

    @property
    def takes_segments(self) -> bool:
        """Whether this model trains on packed batches (`forward(..., segments=)`): not a subclass that replaces the
        forward computation, the encoder's, the decoder's or the positional encoding (a mutant), which take no
        segments or positions; those are called as they were before packing, without them."""
        own = ("forward", "encode", "decode", "decoded")
        return type(self.pe).forward is PositionalEncoding.forward and all(
            getattr(type(self), name) is getattr(Transformer, name) for name in own
        )

    @property
    def decodes_at_fixed_shapes(self) -> bool:
        """Whether beam search may decode this model with a fixed-shape cache (`KVCache.fix_shapes`) and replay its
        steps as a CUDA graph: the reference as written, not a subclass or a check's mutant that replaces the
        decoding, the positional encoding, the causal mask, attention or its modules, which take no device position."""
        return self.takes_segments and self._attention_as_written(
            m for layer in self.decoder for m in (layer.self_attn, layer.cross_attn)
        )

    def loss_is_chunked(self) -> bool:
        """Whether `forward` with labels takes the chunked loss: not in a model that changes the decoding, the
        pre-softmax linear or the loss (a subclass, a mutant, a benchmark's variant), which takes the logits."""
        return (
            self.parts.loss is label_smoothed_loss
            and type(self).loss is Transformer.loss
            and type(self).decode is Transformer.decode
            and type(self.generator) is nn.Linear
        )

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.parts.loss(logits, target, self.config.pad_id, self.config.eps_ls)

    def new_cache(self, beams: int = 1) -> KVCache:
        return KVCache(beams)

    # -- what the checks inspect ---------------------------------------------------------------
    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        records: list[AttentionRecord] = []
        modules = [m for m in self.modules() if isinstance(m, MultiHeadAttention)]
        for m in modules:
            m.records = records
        try:
            yield records
        finally:
            for m in modules:
                m.records = None

    def positional_table(self, positions: int) -> Tensor:
        return self.pe.table(positions)

    def positional_encoding(self, enabled: bool) -> AbstractContextManager[None]:
        return self.pe.switched(enabled)

    def embedding_weights(self) -> dict[str, Tensor]:
        return {"source": self.src_embed.weight, "target": self.tgt_embed.weight, "generator": self.generator.weight}

    def paper_params(self) -> PaperParams:
        """The weights in the paper's layout (model/paper_params.py), for the oracle (invariants/properties/oracle.py)."""
        return export_paper_params(self)

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        """Each sub-layer's output during one forward pass, by the names of model.paper_params.sites."""
        return reference_sublayers(self, src, tgt, src_pad, tgt_pad)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        embeddings = [self.src_embed.weight, self.tgt_embed.weight, self.generator.weight, *self.pe.parameters()]
        return {
            "embeddings": list({id(p): p for p in embeddings}.values()),
            "encoder": list(self.encoder.parameters()),
            "decoder": list(self.decoder.parameters()),
        }
