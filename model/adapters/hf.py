"""HuggingFace encoder-decoders behind the protocol: `hf-marian`, `hf-bart` and `hf:PATH` (needs `pip install .[hf]`).

`hf-marian` and `hf-bart` are MarianMT and BART initialised at random from a config built from the spec's
TransformerConfig (`hf-marian,N=2,d_model=64` works), with the paper's ReLU and dropout sites where HF's defaults
differ (GELU); `hf:PATH` loads a folder written by `save_pretrained`
(or a hub name already in the local cache: nothing is downloaded). Overrides on `hf:PATH` build a random
model of the same family and config with those fields changed, which is what the suite's small drawn
configs do. Every capability is real: the KV cache is HF's past_key_values, attention capture runs the
eager attention path (the fast path is SDPA), the PE table is read from the model, and the PE switch zeroes
the positional embeddings of both stacks. Both libraries use biases and post-LN layers as the paper does;
BART adds a LayerNorm on the embeddings and learns its positions.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Callable, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download at run time
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402  (ImportError is turned into "pip install .[hf]" by model.registry)
from torch import Tensor, nn  # noqa: E402
from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel  # noqa: E402
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding  # noqa: E402

from model.attention import AttentionRecord  # noqa: E402
from model.cache import KVCache  # noqa: E402
from model.config import TransformerConfig  # noqa: E402
from model.init import initialise  # noqa: E402
from model.layers import temporarily  # noqa: E402
from model.objective import label_smoothed_loss  # noqa: E402
from model.adapters.fairseq import fairseq_layers, fairseq_sublayer_hooks  # noqa: E402
from model.paper_params import (  # noqa: E402
    PaperParams,
    Positions,
    extras,
    sublayer_recorder,
)
from model.registry import register_model  # noqa: E402

transformers.logging.set_verbosity_error()  # no notes about tied weights or SDPA fallbacks in the suite's output
FAMILIES = {"marian": (MarianConfig, MarianMTModel), "bart": (BartConfig, BartForConditionalGeneration)}
# The paper's sub-layers where HF's configs default otherwise (both use GELU): eq. (2)'s ReLU, and dropout only where
# section 5.4 puts it, none on attention probabilities or FFN activations. A saved model (hf:PATH) keeps its own.
PAPER = dict(activation_function="relu", attention_dropout=0.0, activation_dropout=0.0)
# Marian's decoder multiplies inputs_embeds by sqrt(d_model) again (its encoder does not); BART scales in the lookup.
DECODER_RESCALES_EMBEDS = {"marian": True, "bart": False}


def _remember_marian_tables() -> None:
    """Marian fills its sinusoid table in a Python loop (seconds at 1024 x 512) on every build; the Table 3 checks
    build dozens. Keep what Marian's own code computed per shape and copy it into later builds of that shape."""
    cls = MarianSinusoidalPositionalEmbedding
    tables: dict[tuple[int, int, torch.dtype], Tensor] = {}

    def computed(self: MarianSinusoidalPositionalEmbedding, compute: Callable[[], Tensor]) -> Tensor:
        key = (*self.weight.shape, self.weight.dtype)
        if key not in tables:
            tables[key] = compute().detach().cpu()
        return tables[key]

    if hasattr(cls, "create_weight"):  # transformers 5: the method returns the table
        create = cls.create_weight
        cls.create_weight = lambda self: computed(self, lambda: create(self)).clone()
        return
    fill = cls._init_weight  # transformers 4: the method fills self.weight in place

    def init_weight(self: MarianSinusoidalPositionalEmbedding) -> None:
        def compute() -> Tensor:
            with torch.device("cpu"):
                probe = nn.Embedding(*self.weight.shape, dtype=self.weight.dtype)
                fill(probe)
            return probe.weight

        table = computed(self, compute)
        self.weight = nn.Parameter(torch.empty_like(self.weight).copy_(table), requires_grad=False)

    cls._init_weight = init_weight


_remember_marian_tables()


class HFCache(KVCache):
    """The protocol's cache around HF's past_key_values (an EncoderDecoderCache once the first step has run)."""

    def __init__(self) -> None:
        super().__init__()
        self.past = None

    def reorder(self, index: Tensor) -> None:
        if self.past is not None:
            self.past.reorder_cache(index)


class HFSeq2Seq(nn.Module):
    """A MarianMTModel or BartForConditionalGeneration with the protocol's methods."""

    def __init__(self, hf: nn.Module, cfg: TransformerConfig) -> None:
        super().__init__()
        self.hf, self.config, self.family = hf, cfg, hf.config.model_type
        self.unsupported: dict[str, str] = {}
        self.encoder, self.decoder = hf.model.encoder, hf.model.decoder
        self._records: list[AttentionRecord] | None = None
        self._positions_on = True
        for stack in (self.encoder, self.decoder):
            stack.embed_positions.register_forward_hook(self._switch_positions)

    def _switch_positions(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        return None if self._positions_on else torch.zeros_like(output)

    def embed(self, ids: Tensor) -> Tensor:
        return self.decoder.embed_tokens(ids) * getattr(self.decoder, "embed_scale", 1.0)

    def _keep(self, kind: str, attentions: tuple | None) -> None:
        if self._records is not None:
            self._records.extend(AttentionRecord(kind, layer, probs) for layer, probs in enumerate(attentions or ()))

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        inputs = {"inputs_embeds": src} if src.is_floating_point() else {"input_ids": src}
        out = self.encoder(
            **inputs, attention_mask=(~src_pad).long(), output_attentions=self._records is not None, return_dict=True
        )
        self._keep("encoder_self", out.attentions)
        return out.last_hidden_state

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: HFCache | None = None
    ) -> Tensor:
        """With a cache, tgt holds only the new positions; earlier target keys are taken as non-pad (right padding)."""
        if tgt.is_floating_point():
            rescale = getattr(self.decoder, "embed_scale", 1.0) if DECODER_RESCALES_EMBEDS[self.family] else 1.0
            inputs = {"inputs_embeds": tgt / rescale}
        else:
            inputs = {"input_ids": tgt}
        offset = cache.length if cache is not None else 0
        seen = torch.ones(tgt_pad.size(0), offset, dtype=torch.long, device=tgt_pad.device)
        out = self.decoder(
            **inputs,
            attention_mask=torch.cat([seen, (~tgt_pad).long()], 1),
            encoder_hidden_states=memory,
            encoder_attention_mask=(~src_pad).long(),
            past_key_values=cache.past if cache is not None else None,
            use_cache=cache is not None,
            output_attentions=self._records is not None,
            return_dict=True,
        )
        self._keep("decoder_self", out.attentions)
        self._keep("cross", out.cross_attentions)
        if cache is not None:
            cache.past, cache.length = out.past_key_values, offset + tgt.size(1)
        return self.hf.lm_head(out.last_hidden_state) + self.hf.final_logits_bias.to(memory.dtype)

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return label_smoothed_loss(logits, target, self.config.pad_id, self.config.eps_ls)

    def new_cache(self) -> HFCache:
        return HFCache()

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        """Capture through HF's eager attention (SDPA returns no probabilities), switched back afterwards."""
        records: list[AttentionRecord] = []
        before = self.hf.config._attn_implementation
        self.hf.config._attn_implementation, self._records = "eager", records
        try:
            yield records
        finally:
            self.hf.config._attn_implementation, self._records = before, None

    def positional_table(self, positions: int) -> Tensor:
        """The encoder's table (BART learns a second one for the decoder; Marian's two are the same sinusoids)."""
        table = self.encoder.embed_positions
        offset = getattr(table, "offset", 0)  # BART keeps two unused rows in front
        return table.weight[offset : offset + positions]

    def positional_encoding(self, enabled: bool) -> AbstractContextManager[None]:
        return temporarily(self, "_positions_on", enabled)

    def embedding_weights(self) -> dict[str, Tensor]:
        return {
            "source": self.encoder.embed_tokens.weight,
            "target": self.decoder.embed_tokens.weight,
            "generator": self.hf.lm_head.weight,
        }

    def paper_params(self) -> PaperParams:
        """HF's weights in the paper's layout (fairseq_layers); embed_positions holds the positions (BART's after
        `offset` rows)."""
        table = lambda stack: stack.embed_positions.weight[getattr(stack.embed_positions, "offset", 0) :]  # noqa: E731
        encoder, decoder = fairseq_layers(self.encoder.layers, self.decoder.layers, self.config.h)
        positions = Positions(self.config.pe, table(self.encoder), table(self.decoder))
        embeddings = (self.encoder.embed_tokens.weight, self.decoder.embed_tokens.weight, self.hf.lm_head.weight)
        params = PaperParams(*embeddings, positions, encoder, decoder)
        more = extras(self, params)  # BART's layernorm_embedding; a final layer_norm where a config adds one
        if bool(self.hf.final_logits_bias.any()):  # a buffer added to the logits, zero unless trained
            more["hf.final_logits_bias"] = self.hf.final_logits_bias
        return replace(params, extras=more)

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        """Sub-layer outputs by forward hooks on HF's modules (attention is called with keyword arguments)."""
        hooks = fairseq_sublayer_hooks(self.encoder, self.decoder, self.hf.lm_head)
        with sublayer_recorder(hooks) as recorded:
            recorded["encoder.output"] = memory = self.encode(src, src_pad)
            recorded["logits"] = self.decode(tgt, memory, src_pad, tgt_pad)
        return recorded

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        lookups = [
            self.encoder.embed_tokens,
            self.decoder.embed_tokens,
            self.hf.lm_head,
            self.encoder.embed_positions,
            self.decoder.embed_positions,
        ]
        embeddings = list({id(p): p for m in lookups for p in m.parameters()}.values())
        taken = {id(p) for p in embeddings}
        return {
            "embeddings": embeddings,
            "encoder": [p for p in self.encoder.parameters() if id(p) not in taken],
            "decoder": [p for p in self.decoder.parameters() if id(p) not in taken],
        }


def hf_config(family: str, cfg: TransformerConfig, base: dict | None = None):
    """The HF config of `family` for cfg, on top of a saved config's other fields if given, else of the paper's
    activation and dropout sites (`PAPER`)."""
    if cfg.h * cfg.d_k != cfg.d_model or cfg.h * cfg.d_v != cfg.d_model:
        raise ValueError(
            f"hf-{family} needs h*d_k == h*d_v == d_model (its heads split d_model); "
            f"got h={cfg.h}, d_k={cfg.d_k}, d_v={cfg.d_v}, d_model={cfg.d_model}"
        )
    if family == "marian" and cfg.pe != "sinusoidal":
        raise ValueError(f"hf-marian always adds sinusoidal positions; pe={cfg.pe!r} is not available")
    if family == "bart" and (cfg.pe == "none" or not cfg.share_embeddings):
        raise ValueError(
            "hf-bart always learns its positions and shares its embeddings (pe='none' and "
            "share_embeddings=false are not available)"
        )
    fields = dict(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.N,
        decoder_layers=cfg.N,
        encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        max_position_embeddings=cfg.max_len,
        dropout=cfg.P_drop,
        pad_token_id=cfg.pad_id,
        decoder_start_token_id=cfg.pad_id,
        bos_token_id=min(1, cfg.vocab_size - 1),
        eos_token_id=min(2, cfg.vocab_size - 1),
        forced_eos_token_id=None,
        scale_embedding=True,
        tie_word_embeddings=cfg.share_embeddings,
    )
    if family == "marian":
        fields.update(share_encoder_decoder_embeddings=cfg.share_embeddings, decoder_vocab_size=cfg.vocab_size)
    config_class, _ = FAMILIES[family]
    return config_class(**{**PAPER, **(base or {}), **fields}, attn_implementation="sdpa")


def random_model(family: str, cfg: TransformerConfig, base: dict | None = None) -> HFSeq2Seq:
    """A randomly initialised model of the family at cfg; reports its positions honestly (BART's are learned)."""
    hf = FAMILIES[family][1](hf_config(family, cfg, base))
    model = HFSeq2Seq(hf, cfg.replace(pe="learned") if family == "bart" else cfg)
    tokens = list({id(w): w for w in model.embedding_weights().values()}.values())
    linears = [m.weight for m in hf.modules() if isinstance(m, nn.Linear)]
    initialise([*tokens, *linears], tokens, cfg)  # by the config's rule, as the reference (init='normal' is HF's own)
    return model


@register_model("hf-marian", "HuggingFace MarianMT, random init at the config")
def build_marian(config: TransformerConfig) -> HFSeq2Seq:
    return random_model("marian", config)


@register_model("hf-bart", "HuggingFace BART, random init at the config")
def build_bart(config: TransformerConfig) -> HFSeq2Seq:
    return random_model("bart", config)


def transformer_config(hf_cfg) -> TransformerConfig:
    """The TransformerConfig that describes a saved HF config (d_k = d_v = d_model / h)."""
    h = hf_cfg.encoder_attention_heads
    return TransformerConfig(
        N=hf_cfg.encoder_layers,
        d_model=hf_cfg.d_model,
        d_ff=hf_cfg.encoder_ffn_dim,
        h=h,
        d_k=hf_cfg.d_model // h,
        d_v=hf_cfg.d_model // h,
        P_drop=hf_cfg.dropout,
        vocab_size=hf_cfg.vocab_size,
        max_len=hf_cfg.max_position_embeddings,
        share_embeddings=bool(hf_cfg.tie_word_embeddings),
        pad_id=hf_cfg.pad_token_id,
        pe="sinusoidal" if hf_cfg.model_type == "marian" else "learned",
    )


@register_model("hf", "a HuggingFace model saved with save_pretrained: hf:PATH", takes="path")
def build_pretrained(path: str | None, changes: dict[str, object]) -> nn.Module:
    """hf:PATH: the saved model itself, or (with config changes) a random model of its family and config."""
    if not path:
        raise ValueError("hf needs a folder: hf:PATH (written by save_pretrained) or a hub name already cached")
    try:
        hf_cfg = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        raise ValueError(
            f"{path} is neither a folder written by save_pretrained nor a hub name in the local cache "
            "(nothing is downloaded at run time: download it once, or save_pretrained to a folder)"
        ) from None
    if hf_cfg.model_type == "fsmt":  # fairseq's WMT19 Transformer: its own adapter
        from model.adapters.hf_fsmt import pretrained

        return pretrained(path, hf_cfg, changes)
    if hf_cfg.model_type not in FAMILIES:
        raise ValueError(
            f"{path} holds a {hf_cfg.model_type!r} model; the hf adapter knows {', '.join(FAMILIES)} and fsmt"
        )
    cfg = transformer_config(hf_cfg)
    if changes:
        return random_model(hf_cfg.model_type, cfg.replace(**changes), hf_cfg.to_dict())
    hf = FAMILIES[hf_cfg.model_type][1].from_pretrained(path, local_files_only=True, attn_implementation="sdpa")
    return HFSeq2Seq(hf, cfg)
