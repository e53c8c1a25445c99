"""HuggingFace FSMT (fairseq's WMT19 post-LN Transformer) behind the protocol: `hf-fsmt` (needs `pip install .[hf]`).

`hf-fsmt` is FSMTForConditionalGeneration initialised at random from an FSMTConfig built from the spec's
TransformerConfig, with eq. (2)'s ReLU and dropout only at section 5.4's sites. It is a third-party post-LN model close
to the paper, so the suite measures where fairseq departs from it: its sinusoids are sin|cos halves with frequencies
10000^(-i/(d/2-1)), added at positions counted from pad_id + 1 (pad tokens get a zero row). FSMT runs time-first
(T, B, C) inside; everything here is batch-first. The KV cache is HF's EncoderDecoderCache, built here because FSMT's
own (use_cache=True) crashes in transformers 4.57: cached steps carry on fairseq's count of non-pad tokens.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace
from typing import Iterator

import torch
import transformers  # (ImportError is turned into "pip install .[hf]" by model.registry)
from torch import Tensor, nn
from transformers import FSMTConfig, FSMTForConditionalGeneration
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from model.adapters.fairseq import fairseq_layers, fairseq_sublayer_hooks
from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
from model.init import initialise
from model.layers import temporarily
from model.objective import label_smoothed_loss
from model.paper_params import PaperParams, Positions, extras, sublayer_recorder
from model.registry import register_model

transformers.logging.set_verbosity_error()
BATCH_FIRST_SITES = ("encoder.output", "decoder.output", "logits")  # FSMT transposes back before these


class FSMTCache(KVCache):
    """The protocol's cache around an EncoderDecoderCache, with each row's count of tokens that took a position."""

    def __init__(self) -> None:
        super().__init__()
        self.past = EncoderDecoderCache(DynamicCache(), DynamicCache())
        self.counted: Tensor | int = 0  # fairseq numbers positions by the non-pad tokens seen so far

    def reorder(self, index: Tensor) -> None:
        self.past.reorder_cache(index)
        self.counted = self.counted[index] if isinstance(self.counted, Tensor) else self.counted


class FSMTSeq2Seq(nn.Module):
    """An FSMTForConditionalGeneration with the protocol's methods and the paper-layout members."""

    def __init__(self, hf: FSMTForConditionalGeneration, cfg: TransformerConfig) -> None:
        super().__init__()
        self.hf, self.config, self.unsupported = hf, cfg, {}
        self.encoder, self.decoder = hf.model.encoder, hf.model.decoder
        self._records: list[AttentionRecord] | None = None
        self._positions_on = True
        self._given: Tensor | None = None  # positions that replace FSMT's own for this call (float inputs, a cache)
        for stack in (self.encoder, self.decoder):
            stack.embed_positions.register_forward_hook(self._positions)

    def _positions(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        return self._given if self._positions_on else torch.zeros_like(output)

    @staticmethod
    def _counts(x: Tensor, pad: Tensor, pad_id: int) -> Tensor:
        """The tokens that take a position: fairseq skips pad_id ids whatever the mask; float inputs go by the mask."""
        return ~pad if x.is_floating_point() else x.ne(pad_id)

    @contextmanager
    def _inputs(self, stack: nn.Module, x: Tensor, pad: Tensor, before: Tensor | int | None) -> Iterator[dict]:
        """FSMT's keywords for ids or for embeddings already scaled by sqrt(d_model) (FSMT would scale them again).
        FSMT numbers ids itself; for float inputs (it reads x[..., 0]) and cached steps (`before` tokens counted
        already) the rows come from fairseq's make_positions here: k-th counted token, row padding_idx + k."""
        floats, table = x.is_floating_point(), stack.embed_positions
        with ExitStack() as context:
            if floats or before is not None:
                counts = self._counts(x, pad, table.padding_idx).long()
                start = before[:, None] if isinstance(before, Tensor) else 0
                rows = (counts.cumsum(1) + start) * counts + table.padding_idx
                context.enter_context(temporarily(self, "_given", table.weight[rows]))
            if floats:
                context.enter_context(temporarily(stack, "embed_scale", 1.0))
            yield {"input_ids": None if floats else x, "inputs_embeds": x if floats else None}

    def embed(self, ids: Tensor) -> Tensor:
        return self.decoder.embed_tokens(ids) * self.decoder.embed_scale

    def _keep(self, kind: str, attentions: tuple | None) -> None:
        if self._records is not None:
            self._records.extend(AttentionRecord(kind, layer, probs) for layer, probs in enumerate(attentions or ()))

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        with self._inputs(self.encoder, src, src_pad, None) as inputs:
            out = self.encoder(**inputs, attention_mask=(~src_pad).long(), output_attentions=self._records is not None)
        self._keep("encoder_self", out.attentions)
        return out.last_hidden_state

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: FSMTCache | None = None
    ) -> Tensor:
        """With a cache, tgt holds only the new positions; earlier target keys are taken as non-pad (right padding)."""
        offset, T = (cache.length if cache is not None else 0), tgt.size(1)
        steps = torch.arange(offset + T, device=memory.device)
        future = steps[None, :] > steps[offset:, None]  # FSMT's additive causal mask, over the cached keys too (its
        causal = memory.new_zeros(future.shape).masked_fill(future, torch.finfo(memory.dtype).min)  # own overflows)
        with self._inputs(self.decoder, tgt, tgt_pad, cache.counted if cache is not None else None) as x:
            out = self.decoder(
                x["input_ids"],
                memory,
                (~src_pad).long(),  # FSMT inverts it to True at padding
                None if cache is not None else tgt_pad,  # already True at padding, as FSMT's own forward passes it
                decoder_causal_mask=causal,
                inputs_embeds=x["inputs_embeds"],
                past_key_values=cache.past if cache is not None else None,  # use_cache=True would crash (no .config)
                use_cache=False,
                output_attentions=self._records is not None,
            )
        self._keep("decoder_self", out.attentions)
        self._keep("cross", out.cross_attentions)
        if cache is not None:
            cache.length = offset + T
            cache.counted = cache.counted + self._counts(tgt, tgt_pad, self.config.pad_id).sum(1)
        return out.last_hidden_state  # FSMT's decoder ends with its output_projection: these are the logits

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return label_smoothed_loss(logits, target, self.config.pad_id, self.config.eps_ls)

    def new_cache(self) -> FSMTCache:
        return FSMTCache()

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        """FSMT returns its probabilities (after masking, before attention dropout) with output_attentions."""
        records: list[AttentionRecord] = []
        with temporarily(self, "_records", records):
            yield records

    def positional_table(self, positions: int) -> Tensor:
        """What the encoder adds at positions 0..: fairseq's rows from padding_idx + 1 on (row padding_idx is zero)."""
        table = self.encoder.embed_positions
        return table.weight[table.padding_idx + 1 : table.padding_idx + 1 + positions]

    def positional_encoding(self, enabled: bool) -> AbstractContextManager[None]:
        return temporarily(self, "_positions_on", enabled)

    def embedding_weights(self) -> dict[str, Tensor]:
        return {
            "source": self.encoder.embed_tokens.weight,
            "target": self.decoder.embed_tokens.weight,
            "generator": self.decoder.output_projection.weight,
        }

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        embeddings = list({id(w): w for w in self.embedding_weights().values()}.values())
        taken = {id(p) for p in embeddings}
        trainable = lambda stack: [p for p in stack.parameters() if p.requires_grad and id(p) not in taken]  # noqa: E731
        return {"embeddings": embeddings, "encoder": trainable(self.encoder), "decoder": trainable(self.decoder)}

    def paper_params(self) -> PaperParams:
        """fairseq's module names, as BART's and Marian's (model/adapters/fairseq.py); the positions are the rows each stack adds
        at positions 0.. (after padding_idx + 1 rows)."""
        table = lambda stack: stack.embed_positions.weight[stack.embed_positions.padding_idx + 1 :]  # noqa: E731
        encoder, decoder = fairseq_layers(self.encoder.layers, self.decoder.layers, self.config.h)
        w = self.embedding_weights()
        positions = Positions("sinusoidal", table(self.encoder), table(self.decoder))
        params = PaperParams(w["source"], w["target"], w["generator"], positions, encoder, decoder)
        return replace(params, extras=extras(self, params))

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        """Sub-layer outputs by forward hooks on FSMT's modules, turned batch-first (FSMT's layers are time-first)."""
        hooks = fairseq_sublayer_hooks(self.encoder, self.decoder, self.decoder.output_projection)
        with sublayer_recorder(hooks) as recorded:
            recorded["encoder.output"] = memory = self.encode(src, src_pad)
            recorded["logits"] = self.decode(tgt, memory, src_pad, tgt_pad)
        return {k: v if k in BATCH_FIRST_SITES else v.transpose(0, 1) for k, v in recorded.items()}


def fsmt_config(cfg: TransformerConfig) -> FSMTConfig:
    """The FSMTConfig for cfg: the paper's ReLU and dropout sites; a field FSMT cannot honour is a ValueError."""
    if cfg.h * cfg.d_k != cfg.d_model or cfg.h * cfg.d_v != cfg.d_model:
        raise ValueError(
            "hf-fsmt needs h*d_k == h*d_v == d_model (its heads split d_model); "
            f"got h={cfg.h}, d_k={cfg.d_k}, d_v={cfg.d_v}, d_model={cfg.d_model}"
        )
    if cfg.pe != "sinusoidal":
        raise ValueError(f"hf-fsmt always adds fairseq's sinusoidal positions; pe={cfg.pe!r} is not available")
    if not cfg.share_embeddings:
        raise ValueError(
            "hf-fsmt always ties its target embedding to the pre-softmax linear; share_embeddings=false is not available"
        )
    special = min(2, cfg.vocab_size - 1)  # bos, eos: only generate() reads them
    return FSMTConfig(
        langs=["src", "tgt"], src_vocab_size=cfg.vocab_size, tgt_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.N, decoder_layers=cfg.N, encoder_attention_heads=cfg.h, decoder_attention_heads=cfg.h,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, max_position_embeddings=cfg.max_len,
        dropout=cfg.P_drop, attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
        scale_embedding=True, tie_word_embeddings=True, pad_token_id=cfg.pad_id, bos_token_id=0,
        eos_token_id=special, decoder_start_token_id=special, forced_eos_token_id=None,
    )  # fmt: skip


@register_model("hf-fsmt", "HuggingFace FSMT (fairseq WMT19), random init at the config")
def build_fsmt(config: TransformerConfig) -> FSMTSeq2Seq:
    """A randomly initialised FSMTForConditionalGeneration at config, its matrices drawn by config.init."""
    hf = FSMTForConditionalGeneration(fsmt_config(config))
    model = FSMTSeq2Seq(hf, config)
    tokens = list({id(w): w for w in model.embedding_weights().values()}.values())
    linears = [m.weight for m in hf.modules() if isinstance(m, nn.Linear) and all(m.weight is not t for t in tokens)]
    initialise([*tokens, *linears], tokens, config)
    return model


def pretrained(path: str, hf_cfg: FSMTConfig, changes: dict[str, object]) -> FSMTSeq2Seq:
    """hf:PATH for a saved FSMT (facebook/wmt19-en-de, say): the model itself, or with config changes a random one."""
    if hf_cfg.src_vocab_size != hf_cfg.tgt_vocab_size:
        raise ValueError(
            f"{path}: source and target vocabularies of {hf_cfg.src_vocab_size} and {hf_cfg.tgt_vocab_size} tokens; "
            "the protocol has one vocab_size (ids of both languages from one vocabulary)"
        )
    h = hf_cfg.encoder_attention_heads
    cfg = TransformerConfig(
        N=hf_cfg.encoder_layers,
        d_model=hf_cfg.d_model,
        d_ff=hf_cfg.encoder_ffn_dim,
        h=h,
        d_k=hf_cfg.d_model // h,
        d_v=hf_cfg.d_model // h,
        P_drop=hf_cfg.dropout,
        vocab_size=hf_cfg.src_vocab_size,
        max_len=hf_cfg.max_position_embeddings,
        share_embeddings=bool(hf_cfg.tie_word_embeddings),
        pad_id=hf_cfg.pad_token_id,
    )
    if changes:
        return build_fsmt(cfg.replace(**changes))
    return FSMTSeq2Seq(FSMTForConditionalGeneration.from_pretrained(path, local_files_only=True), cfg)
