"""JoeyNMT's Transformer behind the protocol: `joeynmt`.

Install: `pip install --no-deps joeynmt==2.3.0 pyyaml==6.0.4 importlib_metadata==8.7.0 zipp==4.1.2 subword-nmt==0.3.8
sentencepiece==0.2.3` (what its model modules import; its other requirements are for training and data).

JoeyNMT 2.3.0 ("minimalist NMT for educational purposes", github.com/joeynmt/joeynmt) is built here by its own
`joeynmt.model.build_model` from a config dict as close to the paper as its options go: `layer_norm: post`, ReLU,
`tied_embeddings` + `tied_softmax` (one matrix, section 3.4), `scale: true` (x sqrt(d_model)), sinusoidal positions,
`XentLoss` with label smoothing, one `dropout` for the layers and the embeddings. What stays different from the paper
(paths are inside the installed `joeynmt/` package), and shows in the checks:

- dropout also on the attention probabilities (transformer_layers.py:95) and after the FFN's ReLU
  (transformer_layers.py:147), both at the one `dropout` rate: section 5.4 drops only sub-layer outputs and the
  embedding sums;
- a query that sees no key (a fully padded source or target row) gets NaN: scores are masked with -inf
  (transformer_layers.py:91) and softmaxed as they are, and the NaN reaches the loss and every gradient;
- positions are numbered by slot (transformer_layers.py:210): JoeyNMT pads on the right (vocabulary.py:187), and
  `padding_side = "right"` says so (a left-padded source would move its tokens' positions);
- no incremental decoding: greedy and beam search re-run the whole prefix each step (search.py:240), so `kv_cache` is
  unsupported;
- the sinusoid table is computed in float32 for 5000 positions (transformer_layers.py:189-194; encoders.py:213,
  decoders.py:542 pass no max_len), so a config with max_len > 5000 is refused;
- the loss is a KL divergence summed over tokens (loss.py:26) with eps/(V-2) on every other non-pad token (loss.py:40),
  its target built in float32 (loss.py:38); JoeyNMT divides it by the number of target tokens only with
  `normalization: tokens` (batch.py:140; the default, config.py:205, divides by sentences), which this adapter does;
- LayerNorm eps is 1e-6 (transformer_layers.py:143, 245, 336-337); the pad row of the embedding is zeroed at init
  (initialization.py:212-213) and gets no gradient from lookups (embeddings.py:50); the pre-softmax linear has no bias
  (decoders.py:549), as in the paper.

JoeyNMT's helpers import tensorboard (helpers.py:21, only a type annotation of a training helper) and matplotlib
(helpers.py:24 -> plotting.py:7, attention plots); where they are missing, stand-ins are put in `sys.modules` while
JoeyNMT is imported and taken out afterwards. JoeyNMT numbers pad as 1 (vocabulary.py:34); the vocabulary here puts
`<pad>` at the config's pad_id instead.
"""

from __future__ import annotations

import logging
import sys
import types
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Iterator

import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
from model.init import NORMAL_STD, std_factor
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

PE_ROWS = 5000  # PositionalEncoding's default max_len (transformer_layers.py:178), which the stacks keep


def _import_joeynmt() -> types.ModuleType:
    """joeynmt.model, with stand-ins for the training-only imports that are missing, removed again afterwards."""
    stubs: dict[str, types.ModuleType] = {}
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        stubs["torch.utils.tensorboard"] = types.ModuleType("torch.utils.tensorboard")
        stubs["torch.utils.tensorboard"].SummaryWriter = object  # helpers.py:159 annotates with it
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        stubs["joeynmt.plotting"] = types.ModuleType("joeynmt.plotting")
        stubs["joeynmt.plotting"].plot_heatmap = None  # only store_attention_plots calls it (helpers.py:183)
    added = [name for name in stubs if name not in sys.modules]
    sys.modules.update({name: stubs[name] for name in added})
    try:
        import joeynmt.model as joey_model
    finally:
        for name in added:
            sys.modules.pop(name, None)
    for name in ("joeynmt.model", "joeynmt.initialization", "joeynmt.embeddings"):
        logging.getLogger(name).setLevel(logging.WARNING)  # get_logger adds an INFO stream handler per module
    return joey_model


_joey = _import_joeynmt()
from joeynmt.transformer_layers import MultiHeadedAttention  # noqa: E402  (after the stand-ins)
from joeynmt.vocabulary import Vocabulary  # noqa: E402


def vocabulary(cfg: TransformerConfig) -> Vocabulary:
    """A JoeyNMT Vocabulary of cfg.vocab_size entries with <pad> at cfg.pad_id (JoeyNMT's own order is unk, pad, bos,
    eos: pad 1; the model reads only the size and the indices, model.py:59-65)."""
    if cfg.vocab_size < 4:
        raise ValueError(f"JoeyNMT's vocabulary holds 4 special tokens; vocab_size={cfg.vocab_size} is too small")
    specials = SimpleNamespace(
        unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>", sep_token=None, lang_tags=[],
        unk_id=0, pad_id=1, bos_id=2, eos_id=3,
    )  # fmt: skip
    vocab = Vocabulary([], specials)  # its add_tokens is quadratic (vocabulary.py:71): 20 s at 37000 tokens
    itos = vocab._itos
    itos += [f"w{i}" for i in range(cfg.vocab_size - len(itos))]
    at = itos.index("<pad>")
    itos[at], itos[cfg.pad_id] = itos[cfg.pad_id], itos[at]
    vocab._stoi = {token: i for i, token in enumerate(itos)}
    vocab.unk_index = vocab._stoi["<unk>"]  # lookup() falls back on it
    vocab.pad_index, vocab.bos_index, vocab.eos_index = (vocab._stoi[t] for t in ("<pad>", "<s>", "</s>"))
    return vocab


def joey_config(cfg: TransformerConfig) -> dict:
    """The `model:` section of a JoeyNMT YAML config for the paper's Transformer at cfg (docs: configs/*.yaml)."""
    factor = std_factor(cfg)
    stack = {
        "type": "transformer",
        "num_layers": cfg.N,
        "num_heads": cfg.h,
        "hidden_size": cfg.d_model,
        "ff_size": cfg.d_ff,
        "dropout": cfg.P_drop,
        "layer_norm": "post",
        "activation": "relu",
        "embeddings": {"embedding_dim": cfg.d_model, "scale": True, "dropout": cfg.P_drop},
    }
    xavier = cfg.init == "xavier"
    return {
        "tied_embeddings": cfg.share_embeddings,
        "tied_softmax": cfg.share_embeddings,
        "initializer": "xavier_uniform" if xavier else "normal",
        "init_gain": factor,
        "init_weight": NORMAL_STD,
        "embed_initializer": "normal",
        "embed_init_weight": cfg.d_model**-0.5 * factor if xavier else NORMAL_STD,
        "bias_initializer": "zeros",
        "encoder": stack,
        "decoder": {**stack, "embeddings": dict(stack["embeddings"])},
    }


class JoeyTransformer(nn.Module):
    """A joeynmt.model.Model (TransformerEncoder, TransformerDecoder, Embeddings, XentLoss) with the protocol."""

    # JoeyNMT pads on the right (vocabulary.py:187) and numbers positions by slot (transformer_layers.py:210): a
    # left-padded source would put its first token at position > 0 (model.protocol.PADDING_SIDES).
    padding_side = "right"

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if cfg.h * cfg.d_k != cfg.d_model or cfg.h * cfg.d_v != cfg.d_model:
            raise ValueError(
                f"JoeyNMT's attention has head size d_model / h (transformer_layers.py:34): needs h*d_k == h*d_v == "
                f"d_model; got h={cfg.h}, d_k={cfg.d_k}, d_v={cfg.d_v}, d_model={cfg.d_model}"
            )
        if cfg.pe != "sinusoidal":
            raise ValueError(
                f"JoeyNMT always adds sinusoidal positions (encoders.py:213); pe={cfg.pe!r} is not available"
            )
        if cfg.max_len > PE_ROWS:
            raise ValueError(f"JoeyNMT's positional table has {PE_ROWS} rows; max_len={cfg.max_len} is not available")
        if cfg.d_model % 2:
            raise ValueError(f"JoeyNMT's sinusoids need an even d_model; got {cfg.d_model}")
        self.config = cfg
        self.unsupported = {"kv_cache": "JoeyNMT decodes by re-running the whole prefix (search.py:240); no KV cache"}
        vocab = vocabulary(cfg)
        self.joey = _joey.build_model(joey_config(cfg), src_vocab=vocab, trg_vocab=vocab)
        self.joey.loss_function = ("crossentropy", cfg.eps_ls)  # XentLoss(pad_index, smoothing), model.py:72-78
        self._records: list[AttentionRecord] | None = None
        for kind, layer, mha in self._attention_modules():
            mha.softmax.register_forward_hook(self._keeper(kind, layer))  # probabilities before attention dropout

    @property
    def encoder(self) -> nn.Module:
        return self.joey.encoder

    @property
    def decoder(self) -> nn.Module:
        return self.joey.decoder

    def _keeper(self, kind: str, layer: int):
        def keep(module, args, probs):
            if self._records is not None:
                self._records.append(AttentionRecord(kind, layer, probs))

        return keep

    def _attention_modules(self) -> Iterator[tuple[str, int, MultiHeadedAttention]]:
        for i, layer in enumerate(self.encoder.layers):
            yield "encoder_self", i, layer.src_src_att
        for i, layer in enumerate(self.decoder.layers):
            yield "decoder_self", i, layer.trg_trg_att
            yield "cross", i, layer.src_trg_att

    # -- the protocol ----------------------------------------------------------------------------------------------

    def embed(self, ids: Tensor) -> Tensor:
        return self.joey.trg_embed(ids)  # lut(ids) * sqrt(d_model), embeddings.py:62-63

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        mask, lengths = ~src_pad[:, None, :], (~src_pad).sum(1)  # JoeyNMT's masks are True at tokens, (B, 1, S)
        if src.is_floating_point():
            return self.encoder(src, lengths, mask)[0]
        return self.joey._encode(src=src, src_length=lengths, src_mask=mask)[0]  # model.py:175-199

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        if cache is not None:
            raise NotImplementedError(self.unsupported["kv_cache"])
        args = dict(encoder_output=memory, encoder_hidden=None, src_mask=~src_pad[:, None, :], unroll_steps=tgt.size(1))
        trg_mask = ~tgt_pad[:, None, :]  # the decoder adds the causal mask (decoders.py:590)
        if tgt.is_floating_point():
            return self.decoder(trg_embed=tgt, hidden=None, trg_mask=trg_mask, **args)[0]
        return self.joey._decode(trg_input=tgt, trg_mask=trg_mask, **args)[0]  # model.py:201-253

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Model.forward's loss path (model.py:105-109), divided by the non-pad tokens as `normalization: tokens`."""
        summed = self.joey.loss_function(F.log_softmax(logits, dim=-1), trg=target)
        return summed / (target != self.config.pad_id).sum()

    def new_cache(self) -> KVCache:
        raise NotImplementedError(self.unsupported["kv_cache"])

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        before, self._records = self._records, []
        try:
            yield self._records
        finally:
            self._records = before

    def positional_table(self, positions: int) -> Tensor:
        return self.encoder.pe.pe[0, :positions]  # the decoder's (decoders.py:542) is the same table

    @contextmanager
    def positional_encoding(self, enabled: bool) -> Iterator[None]:
        with ExitStack() as stack:
            if not enabled:
                for pe in (self.encoder.pe, self.decoder.pe):
                    stack.callback(pe.register_forward_hook(lambda module, args, out: args[0]).remove)
            yield

    def embedding_weights(self) -> dict[str, Tensor]:
        return {
            "source": self.joey.src_embed.lut.weight,
            "target": self.joey.trg_embed.lut.weight,
            "generator": self.decoder.output_layer.weight,
        }

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        groups = {"embeddings": [self.joey.src_embed.lut.weight], "encoder": [], "decoder": []}
        if not self.config.share_embeddings:
            groups["embeddings"] += [self.joey.trg_embed.lut.weight, self.decoder.output_layer.weight]
        groups["encoder"] = list(self.encoder.parameters())
        held = {id(p) for p in groups["embeddings"]}
        groups["decoder"] = [p for p in self.decoder.parameters() if id(p) not in held]
        return groups

    # -- the paper's layout ----------------------------------------------------------------------------------------

    def paper_params(self) -> PaperParams:
        """q_layer, k_layer, v_layer, output_layer are W^Q, W^K, W^V, W^O (transformer_layers.py:38-42); pwff_layer[0]
        and [3] are eq. (2)'s maps (:144-150); the norms follow the sub-layers (:245, :336-337, :143)."""
        h = self.config.h

        def mha(m: MultiHeadedAttention):
            ws = (m.q_layer, m.k_layer, m.v_layer, m.output_layer)
            return multi_head(*(w.weight for w in ws), h, tuple(w.bias for w in ws))

        def ffn(f: nn.Module) -> FeedForward:
            w1, w2 = f.pwff_layer[0], f.pwff_layer[3]
            return FeedForward(w1.weight.T, w1.bias, w2.weight.T, w2.bias)

        ffn_norm = lambda L: L.feed_forward.layer_norm  # noqa: E731  (the FFN block holds its own LayerNorm)
        encoder = tuple(
            EncoderLayer(mha(L.src_src_att), layer_norm(L.layer_norm), ffn(L.feed_forward), layer_norm(ffn_norm(L)))
            for L in self.encoder.layers
        )
        decoder = tuple(
            DecoderLayer(
                mha(L.trg_trg_att),
                layer_norm(L.x_layer_norm),
                mha(L.src_trg_att),
                layer_norm(L.dec_layer_norm),
                ffn(L.feed_forward),
                layer_norm(ffn_norm(L)),
            )
            for L in self.decoder.layers
        )
        e = self.embedding_weights()
        positions = Positions("sinusoidal", self.encoder.pe.pe[0], self.decoder.pe.pe[0])
        params = PaperParams(e["source"], e["target"], e["generator"], positions, encoder, decoder)
        return replace(params, extras=extras(self, params))

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        """Sub-layer outputs by forward hooks; JoeyNMT's attention takes (k, v, q) and its decoder layers keyword
        arguments, so the cross-attention's query and the decoder's embedded input are read by hooks of their own."""
        hooks: dict[str, tuple[nn.Module, str]] = {"encoder.embedded": (self.encoder.layers[0], "input")}
        for stack in ("encoder", "decoder"):
            for i, L in enumerate(getattr(self, stack).layers):
                p = f"{stack}.{i}."
                att = L.src_src_att if stack == "encoder" else L.trg_trg_att
                norms = (L.layer_norm,) if stack == "encoder" else (L.x_layer_norm, L.dec_layer_norm)
                hooks |= {p + "self_attention.input": (att, "input"), p + "self_attention": (att, "output")}
                hooks |= {p + f"norm_{j + 1}": (n, "output") for j, n in enumerate((*norms, L.feed_forward.layer_norm))}
                hooks |= {p + "ffn.input": (L.feed_forward.pwff_layer, "input")}
                hooks |= {p + "ffn": (L.feed_forward.pwff_layer, "output")}
                if stack == "decoder":
                    hooks |= {p + "cross_attention": (L.src_trg_att, "output")}
                    hooks |= {p + "cross_attention.memory": (L.src_trg_att, "memory")}
        hooks["decoder.output"] = (self.decoder.output_layer, "input")
        with ExitStack() as stack, sublayer_recorder(hooks) as recorded:

            def read(site: str, position: int, name: str):
                def hook(module, args, kwargs):
                    recorded[site] = args[position] if len(args) > position else kwargs[name]

                return hook

            first = self.decoder.layers[0].register_forward_pre_hook(read("decoder.embedded", 0, "x"), with_kwargs=True)
            stack.callback(first.remove)
            for i, L in enumerate(self.decoder.layers):
                q = L.src_trg_att.register_forward_pre_hook(
                    read(f"decoder.{i}.cross_attention.input", 2, "q"), with_kwargs=True
                )
                stack.callback(q.remove)
            recorded["encoder.output"] = memory = self.encode(src, src_pad)
            recorded["logits"] = self.decode(tgt, memory, src_pad, tgt_pad)
        return recorded


@register_model("joeynmt", "JoeyNMT 2.3.0's Transformer (post-LN, tied, scaled), random init at the config")
def build(config: TransformerConfig) -> JoeyTransformer:
    return JoeyTransformer(config)
