"""OpenNMT-py 3.5.1 (`pip install --no-deps OpenNMT-py==3.5.1`): its Transformer encoder-decoder behind the protocol.

Built from the library's own classes, `onmt.modules.Embeddings`, `onmt.encoders.TransformerEncoder`,
`onmt.decoders.TransformerDecoder` and `onmt.utils.loss.LossCompute`, configured as OpenNMT's
documented Transformer recipe and as close to the paper as its options go: ReLU FFN, sinusoidal interleaved positions,
no attention biases (`add_qkvbias=False`, as the paper writes none), source, target and generator sharing one matrix
(`share_embeddings`, `share_decoder_embeddings`), Xavier init (`param_init_glorot`), label smoothing eps_ls,
residual dropout P_drop and attention_dropout 0 (section 5.4 has none on the probabilities). The model code imports
only torch and numpy; `onmt/__init__.py` and `onmt/decoders/__init__.py` import the data pipeline (pyonmttok, spacy),
so `_onmt()` imports the model modules under light parent packages instead.
Options set away from opts.py's defaults, each as the paper and OpenNMT's own Transformer recipe have it:
attention_dropout 0 (default 0.1), param_init 0 with param_init_glorot (default uniform 0.1), label_smoothing eps_ls
(default 0), normalization tokens (default sents), self_attn_type left at scaled-dot-flash (the explicit path on CPU).

Departures that stay visible in the checks (paths under site-packages/onmt/):
- Pre-LN, and no option for post-LN (section 3.1): x + Sublayer(LayerNorm(x)) at encoders/transformer.py:119-131,
  decoders/transformer.py:389-420 and modules/position_ffn.py:101,117 (the docstring at decoders/transformer.py:254
  says so), with a final LayerNorm on each stack (encoders/transformer.py:267, decoders/transformer.py:711).
- Dropout inside the FFN, after the ReLU (modules/position_ffn.py:108-109), besides section 5.4's residual dropout.
- A bias on the pre-softmax linear (model_builder.py:380-386 builds nn.Linear with bias; only the weight is tied).
- Attention scores and softmax in float32 whatever the model's dtype (modules/multi_headed_attn.py:708,719), and the
  loss on float32 scores (utils/loss.py:348); masking with -1e18, not -inf (multi_headed_attn.py:716).
- The trainer's `normalization: tokens` divides the summed loss by the non-pad target tokens minus one per sentence
  ("don't count for EOS", trainer.py:241-245,516); `loss` does the same.
- Only h * d_k = h * d_v = d_model (dim_per_head = model_dim // heads, modules/multi_headed_attn.py:288); no learned
  or absent positions without dropping the sqrt(d_model) scaling, which lives in the PE module (embeddings.py:70);
  positions up to 5000 (embeddings.py:211).
What the adapter does beside the library: encode/decode run the stacks' own layers in their forward's loop
(encoders/transformer.py:258-267, decoders/transformer.py:683-711) with masks from src_pad/tgt_pad (the library derives
them from lengths and pad ids, so float inputs and left padding could not come in); the KV cache is OpenNMT's own
stepwise decoding (`step`, the attention modules' `layer_cache`, one position a step as its translator decodes), its
tensors kept in the harness's KVCache between calls.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Iterator

import torch
from torch import Tensor, nn

from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
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

PE_MAX_LEN = 5000  # Embeddings builds PositionalEncoding(dim, type) with its default max_len (embeddings.py:211)


def _onmt() -> types.SimpleNamespace:
    """OpenNMT's model modules. `import onmt` runs onmt/__init__.py, which imports the data pipeline (pyonmttok, and
    spacy through onmt.transforms); onmt/decoders/__init__.py imports every decoder file, ensemble.py among them, which
    imports that pipeline again. Where `onmt` is not imported yet, both are light packages over the installed folders,
    and utils/loss.py's one import of onmt.model_builder (for an LM prior, not used here) is stubbed while it loads."""
    if "onmt" not in sys.modules:
        spec = importlib.util.find_spec("onmt")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("OpenNMT-py is not installed: pip install --no-deps OpenNMT-py==3.5.1")
        root = list(spec.submodule_search_locations)[0]
        for name, folder in (("onmt", root), ("onmt.decoders", f"{root}/decoders")):
            package = types.ModuleType(name)
            package.__path__ = [folder]
            sys.modules[name] = package
        sys.modules["onmt"].decoders = sys.modules["onmt.decoders"]
    if "onmt.utils.loss" not in sys.modules and "onmt.model_builder" not in sys.modules:
        stub = types.ModuleType("onmt.model_builder")
        stub.load_test_model = None
        sys.modules["onmt.model_builder"] = stub
        try:
            importlib.import_module("onmt.utils.loss")
        finally:
            del sys.modules["onmt.model_builder"]
    get = importlib.import_module
    return types.SimpleNamespace(
        Embeddings=get("onmt.modules.embeddings").Embeddings,
        TransformerEncoder=get("onmt.encoders.transformer").TransformerEncoder,
        TransformerDecoder=get("onmt.decoders.transformer").TransformerDecoder,
        LossCompute=get("onmt.utils.loss").LossCompute,
    )


def _empty_cache() -> tuple[bool, dict[str, Tensor]]:
    return False, {"keys": torch.tensor([]), "values": torch.tensor([])}  # decoders/transformer.py:674-681


class OpenNMTTransformer(nn.Module):
    """OpenNMT-py's TransformerEncoder and TransformerDecoder with a shared embedding and a tied generator."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if cfg.h * cfg.d_k != cfg.d_model or cfg.h * cfg.d_v != cfg.d_model:
            raise ValueError(
                f"OpenNMT-py needs h*d_k == h*d_v == d_model (dim_per_head = d_model // heads); got h={cfg.h}, "
                f"d_k={cfg.d_k}, d_v={cfg.d_v}, d_model={cfg.d_model}"
            )
        if cfg.pe != "sinusoidal":
            raise ValueError(
                f"OpenNMT-py's Embeddings add sinusoids or no positions, and without them drop the sqrt(d_model) "
                f"scaling (embeddings.py:70); pe={cfg.pe!r} is not available"
            )
        if cfg.max_len > PE_MAX_LEN:
            raise ValueError(f"OpenNMT-py's positional table has {PE_MAX_LEN} rows; max_len={cfg.max_len} is longer")
        onmt = _onmt()
        self.config = cfg
        self.unsupported: dict[str, str] = {}
        d, P = cfg.d_model, cfg.P_drop

        def embeddings() -> nn.Module:
            return onmt.Embeddings(
                d, cfg.vocab_size, cfg.pad_id, position_encoding=True,
                position_encoding_type="SinusoidalInterleaved", dropout=P,
            )  # fmt: skip

        common = dict(
            pos_ffn_activation_fn="relu", add_qkvbias=False, num_kv=0, add_ffnbias=True,
            parallel_residual=False, layer_norm="standard", norm_eps=1e-6,
        )  # fmt: skip
        src_emb, tgt_emb = embeddings(), embeddings()
        if cfg.share_embeddings:
            tgt_emb.word_lut.weight = src_emb.word_lut.weight  # model_builder.py:218-219
        self.encoder = onmt.TransformerEncoder(cfg.N, d, cfg.h, cfg.d_ff, P, 0.0, src_emb, 0, 0, **common)
        self.decoder = onmt.TransformerDecoder(
            cfg.N, d, cfg.h, cfg.d_ff, False, "scaled-dot-flash", P, 0.0, tgt_emb, 0, 0, False, False, 0, 0,
            shared_layer_norm=False, sliding_window=0, num_experts=0, **common,
        )  # fmt: skip
        self.generator = torch.nn.utils.skip_init(nn.Linear, d, cfg.vocab_size)  # model_builder.py:380-384
        if cfg.share_embeddings:
            self.generator.weight = tgt_emb.word_lut.weight  # share_decoder_embeddings, model_builder.py:385-386
        for module in self.modules():  # param_init 0, param_init_glorot (model_builder.py:410-416)
            for name, p in module.named_parameters(recurse=False):
                if name == "weight" and p.dim() > 1:
                    nn.init.xavier_uniform_(p)
                elif name == "bias":
                    nn.init.zeros_(p)
        criterion = nn.CrossEntropyLoss(ignore_index=cfg.pad_id, reduction="sum", label_smoothing=cfg.eps_ls)
        # LossCompute.from_opts builds this criterion (utils/loss.py:101-105); the logits come in already generated.
        self.loss_compute = onmt.LossCompute(criterion, nn.Identity(), tgt_shift_index=0)
        self._capture: list[AttentionRecord] | None = None
        self._stashed_pe: list[Tensor] | None = None

    # -- inputs ---------------------------------------------------------------------------------------------------
    def _pe_modules(self) -> list[nn.Module]:
        return [self.encoder.embeddings.make_embedding.pe, self.decoder.embeddings.make_embedding.pe]

    def _embedded(self, embeddings: nn.Module, x: Tensor, step: int | None) -> Tensor:
        """ids through OpenNMT's Embeddings (lookup, x sqrt(d) + PE in its PositionalEncoding, dropout); float
        embeddings, already scaled, through the same PositionalEncoding and dropout (divided by sqrt(d) first, since
        that module multiplies: embeddings.py:70)."""
        if not x.is_floating_point():
            return embeddings(x.unsqueeze(-1), step=step)
        x = embeddings.make_embedding.pe(x / math.sqrt(self.config.d_model), step=step)
        return embeddings.dropout(x) if embeddings.dropout_p > 0 else x  # embeddings.py:305-306

    def embed(self, ids: Tensor) -> Tensor:
        return self.decoder.embeddings.word_lut(ids) * math.sqrt(self.config.d_model)  # embeddings.py:70

    # -- the stacks -----------------------------------------------------------------------------------------------
    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        x = self._embedded(self.encoder.embeddings, src, None)
        mask = src_pad[:, None, None, :].expand(-1, -1, src_pad.size(1), -1)  # True = masked, (B, 1, S, S)
        for layer in self.encoder.transformer:  # encoders/transformer.py:265-267
            x = layer(x, mask)
        return self.encoder.layer_norm(x)

    def _reset_caches(self) -> None:
        for layer in self.decoder.transformer_layers:
            layer.self_attn.layer_cache, layer.context_attn.layer_cache = _empty_cache(), _empty_cache()

    def _layers(self, x: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, step: int | None) -> Tensor:
        for layer in self.decoder.transformer_layers:  # decoders/transformer.py:698-707
            x, _, _ = layer(
                x, memory, src_pad[:, None, :], tgt_pad[:, None, :], step=step, return_attn=self._capture is not None
            )
        return x

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        if cache is None:
            self._reset_caches()
            x = self._layers(self._embedded(self.decoder.embeddings, tgt, None), memory, src_pad, tgt_pad, None)
        else:
            x = self._decode_cached(tgt, memory, src_pad, cache)
        return self.generator(self.decoder.layer_norm(x))  # decoders/transformer.py:711; model_builder.py:394

    def _decode_cached(self, tgt: Tensor, memory: Tensor, src_pad: Tensor, cache: KVCache) -> Tensor:
        """OpenNMT's stepwise decoding, one position per step with step = its position, as its translator does: each
        attention module's `layer_cache` is (True, {keys, values}) while decoding (decoders/transformer.py:723-750,
        multi_headed_attn.py:443-566); between calls those tensors live in the harness's cache."""
        layers = self.decoder.transformer_layers
        outputs = []
        try:
            for j in range(tgt.size(1)):
                for i, layer in enumerate(layers):
                    for name, attn in ((f"decoder_self.{i}", layer.self_attn), (f"cross.{i}", layer.context_attn)):
                        k, v = cache.kv.get(name, (memory.new_empty(0), memory.new_empty(0)))
                        attn.layer_cache = True, {"keys": k, "values": v}
                step = cache.length + j
                x = self._embedded(self.decoder.embeddings, tgt[:, j : j + 1], step)
                no_pad = torch.zeros(tgt.size(0), 1, dtype=torch.bool, device=tgt.device)
                outputs.append(self._layers(x, memory, src_pad, no_pad, step))
                for i, layer in enumerate(layers):
                    for name, attn in ((f"decoder_self.{i}", layer.self_attn), (f"cross.{i}", layer.context_attn)):
                        cache.kv[name] = (attn.layer_cache[1]["keys"], attn.layer_cache[1]["values"])
        finally:
            self._reset_caches()
        cache.length += tgt.size(1)
        return torch.cat(outputs, 1)

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """OpenNMT's LossCompute (its criterion on float32 scores, summed), divided as its trainer divides under
        `normalization: tokens`: by the non-pad target tokens less one per sentence (trainer.py:241-245, 516)."""
        batch = {"tgt": target.unsqueeze(-1), "srclen": target.new_ones(target.size(0))}
        total, _ = self.loss_compute(batch, logits, {})
        return total / (target.ne(self.config.pad_id).sum() - target.size(0))

    def new_cache(self) -> KVCache:
        return KVCache()

    # -- attention and positions ----------------------------------------------------------------------------------
    def _attention_modules(self) -> Iterator[tuple[str, int, nn.Module]]:
        for i, layer in enumerate(self.encoder.transformer):
            yield "encoder_self", i, layer.self_attn
        for i, layer in enumerate(self.decoder.transformer_layers):
            yield "decoder_self", i, layer.self_attn
            yield "cross", i, layer.context_attn

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        """The probabilities each MultiHeadedAttention returns (after the mask, before attention dropout,
        multi_headed_attn.py:719-720); decoder layers are asked for them with return_attn, which keeps the
        explicit path where a GPU would take scaled_dot_product_attention (multi_headed_attn.py:628-664)."""
        records: list[AttentionRecord] = []

        def keep(kind: str, layer: int):
            return lambda module, args, out: records.append(AttentionRecord(kind, layer, out[1]))

        with ExitStack() as stack:
            for kind, layer, mha in self._attention_modules():
                stack.callback(mha.register_forward_hook(keep(kind, layer)).remove)
            before, self._capture = self._capture, records
            stack.callback(setattr, self, "_capture", before)
            yield records

    def positional_table(self, positions: int) -> Tensor:
        table = self._stashed_pe[0] if self._stashed_pe is not None else self._pe_modules()[0].pe
        return table[:positions, 0]  # stored (len, 1, d) "for back comp" (embeddings.py:55)

    @contextmanager
    def positional_encoding(self, enabled: bool) -> Iterator[None]:
        """Off: both PositionalEncoding modules add a zero table (they keep multiplying by sqrt(d_model)); the real
        tables wait in _stashed_pe. Nested switches put back what they found."""
        modules = self._pe_modules()
        found, stashed = [m.pe for m in modules], self._stashed_pe
        try:
            if enabled and stashed is not None:
                for m, table in zip(modules, stashed):
                    m.pe = table
                self._stashed_pe = None
            elif not enabled and stashed is None:
                self._stashed_pe = found
                for m in modules:
                    m.pe = torch.zeros_like(m.pe)
            yield
        finally:
            for m, table in zip(modules, found):
                m.pe = table
            self._stashed_pe = stashed

    def embedding_weights(self) -> dict[str, Tensor]:
        return {
            "source": self.encoder.embeddings.word_lut.weight,
            "target": self.decoder.embeddings.word_lut.weight,
            "generator": self.generator.weight,
        }

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        def stack(module: nn.Module) -> list[nn.Parameter]:
            return [p for n, p in module.named_parameters() if not n.startswith("embeddings.")]

        embeddings = list({id(p): p for p in (*self.embedding_weights().values(),)}.values())
        return {
            "embeddings": embeddings,
            "encoder": stack(self.encoder),
            "decoder": stack(self.decoder),
            "generator": [self.generator.bias],
        }

    # -- the paper's layout ---------------------------------------------------------------------------------------
    def paper_params(self) -> PaperParams:
        """OpenNMT's weights in the paper's layout: linear_query/keys/values and final_linear are W^Q, W^K, W^V, W^O
        (no biases), w_1 and w_2 eq. (2)'s maps. The pre-LN norms go in the order the sub-layers use them: the one
        before each sub-layer stands for the paper's after it; the stacks' final norms and the generator's bias are
        extras."""
        h = self.config.h

        def mha(m: nn.Module):
            linears = (m.linear_query, m.linear_keys, m.linear_values, m.final_linear)
            return multi_head(*(x.weight for x in linears), h, tuple(x.bias for x in linears))

        def ffn(f: nn.Module) -> FeedForward:
            return FeedForward(f.w_1.weight.T, f.w_1.bias, f.w_2.weight.T, f.w_2.bias)

        encoder = tuple(
            EncoderLayer(mha(la.self_attn), layer_norm(la.layer_norm), ffn(la.feed_forward),
                         layer_norm(la.feed_forward.layer_norm))
            for la in self.encoder.transformer
        )  # fmt: skip
        decoder = tuple(
            DecoderLayer(mha(la.self_attn), layer_norm(la.layer_norm_1), mha(la.context_attn),
                         layer_norm(la.layer_norm_2), ffn(la.feed_forward), layer_norm(la.feed_forward.layer_norm))
            for la in self.decoder.transformer_layers
        )  # fmt: skip
        tables = [m.pe[:, 0] for m in self._pe_modules()]
        w = self.embedding_weights()
        params = PaperParams(
            w["source"], w["target"], w["generator"], Positions("sinusoidal", *tables), encoder, decoder
        )
        return replace(params, extras=extras(self, params))

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict[str, Tensor]:
        """Sub-layer outputs by forward hooks. With pre-LN, norm_k is the residual stream after sub-layer k (what
        the paper's LayerNorm outputs and the next sub-layer reads); X.input is what the attention or FFN receives."""
        hooks: dict[str, tuple[nn.Module, str]] = {}
        queries: dict[str, nn.Module] = {}  # context_attn(enc_out, enc_out, query): the query is the third argument
        for name, layers in (("encoder", self.encoder.transformer), ("decoder", self.decoder.transformer_layers)):
            hooks[f"{name}.embedded"] = (layers[0], "input")
            for i, la in enumerate(layers):
                p, ff = f"{name}.{i}.", la.feed_forward
                hooks[p + "self_attention.input"] = (la.self_attn, "input")
                hooks[p + "self_attention"] = (la.self_attn, "output")
                hooks |= {p + "ffn.input": (ff.w_1, "input"), p + "ffn": (ff.w_2, "output")}
                if name == "encoder":
                    hooks |= {p + "norm_1": (ff, "input"), p + "norm_2": (ff, "output")}
                else:
                    hooks |= {p + "norm_1": (la.layer_norm_2, "input"), p + "norm_2": (ff, "input")}
                    hooks |= {p + "norm_3": (ff, "output"), p + "cross_attention.memory": (la.context_attn, "memory")}
                    hooks[p + "cross_attention"] = (la.context_attn, "output")
                    queries[p + "cross_attention.input"] = la.context_attn
        hooks["decoder.output"] = (self.decoder.layer_norm, "output")
        with sublayer_recorder(hooks) as recorded, ExitStack() as stack:
            for site, module in queries.items():
                hook = lambda m, args, site=site: recorded.__setitem__(site, args[2])  # noqa: E731
                stack.callback(module.register_forward_pre_hook(hook).remove)
            recorded["encoder.output"] = memory = self.encode(src, src_pad)
            recorded["logits"] = self.decode(tgt, memory, src_pad, tgt_pad)
        return recorded


@register_model("opennmt", "OpenNMT-py 3.5.1's Transformer (pre-LN), random init (pip install --no-deps OpenNMT-py)")
def build(config: TransformerConfig) -> OpenNMTTransformer:
    return OpenNMTTransformer(config)
