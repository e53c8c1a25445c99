"""The paper's parameters in the paper's own terms, so that any model's weights can be loaded into the reference.

Vaswani et al. (2017) write every weight as a matrix acting on row vectors (x W): the shared embedding matrix of
section 3.4, per attention W^Q_i, W^K_i (d_model x d_k), W^V_i (d_model x d_v) for each head i and W^O (h d_v x d_model)
of section 3.2.2, W1, b1, W2, b2 of eq. (2), and the LayerNorm after each sub-layer (section 3.1). `PaperParams` holds
them in that orientation; an adapter fills it from its own parameter names (a torch Linear's weight is W transposed).
A parameter the paper has and the model lacks is None (a finding); parameters beyond the paper go into `extras` under
the model's own names. `export_paper_params` / `load_paper_params` do it for the reference; `sublayer_recorder`
records the sub-layer outputs of `SITES` with forward hooks, for the oracle's localisation (invariants/properties/oracle.py).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Iterator, Mapping

import torch
from torch import Tensor, nn

from model.config import TransformerConfig


@dataclass(frozen=True)
class MultiHead:
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i) (sec. 3.2.2);
    the paper writes no biases, a model's are kept (b_Q, b_K, b_V per head, b_O)."""

    W_Q: Tensor  # (h, d_model, d_k)
    W_K: Tensor  # (h, d_model, d_k)
    W_V: Tensor  # (h, d_model, d_v)
    W_O: Tensor  # (h * d_v, d_model)
    b_Q: Tensor | None = None  # (h, d_k)
    b_K: Tensor | None = None  # (h, d_k)
    b_V: Tensor | None = None  # (h, d_v)
    b_O: Tensor | None = None  # (d_model,)


@dataclass(frozen=True)
class FeedForward:
    """FFN(x) = max(0, x W1 + b1) W2 + b2, eq. (2)."""

    W1: Tensor  # (d_model, d_ff)
    b1: Tensor | None  # (d_ff,); None: the model lacks it
    W2: Tensor  # (d_ff, d_model)
    b2: Tensor | None  # (d_model,)


@dataclass(frozen=True)
class LayerNorm:
    """The normalisation in LayerNorm(x + Sublayer(x)) (section 3.1): gain and bias, and the model's epsilon (the paper
    gives none)."""

    gain: Tensor | None  # (d_model,); None: the model lacks it (a gain of 1)
    bias: Tensor | None  # (d_model,); None: a bias of 0
    eps: float = 1e-5


@dataclass(frozen=True)
class EncoderLayer:
    """Self-attention then the FFN, each followed by its residual and LayerNorm (section 3.1)."""

    self_attention: MultiHead
    norm_1: LayerNorm
    ffn: FeedForward
    norm_2: LayerNorm


@dataclass(frozen=True)
class DecoderLayer:
    """Masked self-attention, encoder-decoder attention, the FFN, each followed by residual and LayerNorm (3.1)."""

    self_attention: MultiHead
    norm_1: LayerNorm
    cross_attention: MultiHead
    norm_2: LayerNorm
    ffn: FeedForward
    norm_3: LayerNorm


@dataclass(frozen=True)
class Positions:
    """The positional encoding (section 3.5): 'sinusoidal' has no parameters (source and target may hold the model's
    fixed table, which the oracle checks against the formula), 'learned' (Table 3 row E) a table per stack."""

    kind: str  # 'sinusoidal' | 'learned' | 'none'
    source: Tensor | None = None  # (positions, d_model), added in the encoder
    target: Tensor | None = None  # (positions, d_model), added in the decoder (the same tensor where shared)


@dataclass(frozen=True)
class PaperParams:
    """Every parameter of the paper's encoder-decoder, named as the paper names it, plus what a model adds."""

    source_embedding: Tensor  # (vocab, d_model); x = E[token] * sqrt(d_model) (section 3.4)
    target_embedding: Tensor  # (vocab, d_model); the same tensor as source_embedding when shared
    pre_softmax: Tensor  # (vocab, d_model); logits = x pre_softmax^T, the same tensor when shared (section 3.4)
    positions: Positions
    encoder: tuple[EncoderLayer, ...]
    decoder: tuple[DecoderLayer, ...]
    extras: Mapping[str, Tensor] = field(default_factory=dict)  # model's own name -> a parameter the paper lacks

    def missing(self) -> list[str]:
        """Paper parameters the model lacks (None), by path: 'encoder.0.norm_1.gain', ..."""

        def optional(path: str) -> bool:  # the paper writes no attention biases, and sinusoids have no table
            return path.split(".")[-1].startswith("b_") or (
                path.startswith("positions.") and self.positions.kind != "learned"
            )

        return [path for path, value in leaves(self) if value is None and not optional(path)]

    def shared(self) -> bool:
        """Whether one matrix serves as both embeddings and the pre-softmax linear (section 3.4)."""
        a, b, c = self.source_embedding, self.target_embedding, self.pre_softmax
        return all(storage(x) == storage(a) and x.shape == a.shape for x in (b, c))


def storage(x: Tensor) -> int:
    """Where a tensor's memory starts: the same for a parameter and every view of it (a transpose, a head split)."""
    return x.untyped_storage().data_ptr()


def moved(params: PaperParams, device: torch.device) -> PaperParams:
    """A copy of params on `device` in which tensors that shared memory still share it (views of one weight, the tied
    embeddings of section 3.4 stay tied), each storage copied once."""
    copies: dict[int, torch.UntypedStorage] = {}

    def move(x: object) -> object:
        if isinstance(x, Tensor):
            x = x.detach()
            if storage(x) not in copies:  # a fresh copy even on the same device: never the model's own memory
                source = x.untyped_storage()
                copies[storage(x)] = source.clone() if source.device == device else source.to(device=device)
            memory = copies[storage(x)]
            return torch.empty(0, dtype=x.dtype, device=device).set_(memory, x.storage_offset(), x.size(), x.stride())
        if isinstance(x, tuple):
            return tuple(move(item) for item in x)
        if isinstance(x, Mapping):
            return {k: move(v) for k, v in x.items()}
        if isinstance(x, (MultiHead, FeedForward, LayerNorm, EncoderLayer, DecoderLayer, Positions, PaperParams)):
            return replace(x, **{f.name: move(getattr(x, f.name)) for f in fields(x)})
        return x

    return move(params)


def leaves(obj: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(path, value) of every tensor-or-None field, depth first, in the order the paper's layout declares them."""
    if isinstance(obj, tuple):
        for i, item in enumerate(obj):
            yield from leaves(item, f"{prefix}{i}.")
        return
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name == "extras" or isinstance(value, (str, float)):
            continue
        if isinstance(value, (tuple, MultiHead, FeedForward, LayerNorm, EncoderLayer, DecoderLayer, Positions)):
            yield from leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def check_shapes(params: PaperParams, cfg: TransformerConfig) -> None:
    """A ValueError naming the first matrix whose shape is not the paper's at cfg (an adapter's mistake)."""
    d, h, k, v, ff, V = cfg.d_model, cfg.h, cfg.d_k, cfg.d_v, cfg.d_ff, cfg.vocab_size
    want = {"source_embedding": (V, d), "target_embedding": (V, d), "pre_softmax": (V, d)}
    attention = {"W_Q": (h, d, k), "W_K": (h, d, k), "W_V": (h, d, v), "W_O": (h * v, d)}
    attention |= {"b_Q": (h, k), "b_K": (h, k), "b_V": (h, v), "b_O": (d,)}
    ffn = {"W1": (d, ff), "b1": (ff,), "W2": (ff, d), "b2": (d,)}
    if (len(params.encoder), len(params.decoder)) != (cfg.N, cfg.N):
        raise ValueError(f"paper_params has {len(params.encoder)}/{len(params.decoder)} layers; N={cfg.N}")
    for path, value in leaves(params):
        name, parent = path.split(".")[-1], path.split(".")[-2] if "." in path else ""
        shape = want.get(path) or (attention if "attention" in parent else ffn if parent == "ffn" else {}).get(name)
        if name in ("gain", "bias"):
            shape = (d,)
        if isinstance(value, Tensor) and shape and tuple(value.shape) != shape:
            raise ValueError(f"paper_params: {path} has shape {tuple(value.shape)}, the paper's is {shape} at {cfg}")


# -- from and to torch's (out, in) Linear weights ----------------------------------------------------------------


def heads(weight: Tensor, h: int) -> Tensor:
    """A Linear's (h * d, d_model) weight as the paper's W_i for each head, (h, d_model, d)."""
    return weight.T.unflatten(1, (h, -1)).permute(1, 0, 2)


def multi_head(
    w_q: Tensor, w_k: Tensor, w_v: Tensor, w_o: Tensor, h: int, biases=(None, None, None, None)
) -> MultiHead:
    """MultiHead from four torch Linear weights (out, in) and their biases (None where absent)."""
    b_q, b_k, b_v, b_o = biases
    split = lambda b: None if b is None else b.unflatten(0, (h, -1))  # noqa: E731
    return MultiHead(heads(w_q, h), heads(w_k, h), heads(w_v, h), w_o.T, split(b_q), split(b_k), split(b_v), b_o)


def layer_norm(norm: nn.Module) -> LayerNorm:
    """A LayerNorm module's gain, bias and eps; a module without them (no normalisation) gives None."""
    return LayerNorm(getattr(norm, "weight", None), getattr(norm, "bias", None), float(getattr(norm, "eps", 1e-5)))


def extras(model: nn.Module, params: PaperParams) -> dict[str, Tensor]:
    """The model's trainable parameters that the layout does not hold, by the model's own names."""
    held = {storage(value) for _, value in leaves(params) if isinstance(value, Tensor)}
    return {name: p for name, p in model.named_parameters() if p.requires_grad and storage(p) not in held}


# -- the reference ------------------------------------------------------------------------------------------------


def export_paper_params(model: nn.Module) -> PaperParams:
    """The reference's weights (or a mutant's: the same modules) in the paper's layout."""
    cfg = model.config
    mha = lambda m: multi_head(  # noqa: E731
        m.w_q.weight, m.w_k.weight, m.w_v.weight, m.w_o.weight, cfg.h, (m.w_q.bias, m.w_k.bias, m.w_v.bias, m.w_o.bias)
    )
    ffn = lambda f: FeedForward(f.w_1.weight.T, f.w_1.bias, f.w_2.weight.T, f.w_2.bias)  # noqa: E731
    table = {"sinusoidal": lambda: model.pe.fixed, "learned": lambda: model.pe.learned.weight}.get(cfg.pe)
    positions = Positions(cfg.pe, table() if table else None, table() if table else None)
    encoder = tuple(
        EncoderLayer(
            mha(layer.self_attn), layer_norm(layer.res_attn.norm), ffn(layer.ffn), layer_norm(layer.res_ffn.norm)
        )
        for layer in model.encoder
    )
    decoder = tuple(
        DecoderLayer(
            mha(layer.self_attn),
            layer_norm(layer.res_self.norm),
            mha(layer.cross_attn),
            layer_norm(layer.res_cross.norm),
            ffn(layer.ffn),
            layer_norm(layer.res_ffn.norm),
        )
        for layer in model.decoder
    )
    params = PaperParams(
        model.src_embed.weight, model.tgt_embed.weight, model.generator.weight, positions, encoder, decoder
    )
    return replace(params, extras=extras(model, params))


def _linear(linear: nn.Linear, weight: Tensor, bias: Tensor | None) -> None:
    linear.weight.copy_(weight)
    if linear.bias is not None:
        linear.bias.copy_(bias if bias is not None else torch.zeros_like(linear.bias))


def _norm(norm: nn.LayerNorm, given: LayerNorm) -> None:
    norm.weight.copy_(given.gain if given.gain is not None else torch.ones_like(norm.weight))
    norm.bias.copy_(given.bias if given.bias is not None else torch.zeros_like(norm.bias))
    norm.eps = given.eps


def _multi_head(m: nn.Module, given: MultiHead) -> None:
    flat = lambda w: w.permute(1, 0, 2).flatten(1).T  # (h, d_model, d) -> Linear's (h * d, d_model)  # noqa: E731
    bias = lambda b: None if b is None else b.flatten()  # noqa: E731
    _linear(m.w_q, flat(given.W_Q), bias(given.b_Q))
    _linear(m.w_k, flat(given.W_K), bias(given.b_K))
    _linear(m.w_v, flat(given.W_V), bias(given.b_V))
    _linear(m.w_o, given.W_O.T, given.b_O)


def _ffn(f: nn.Module, given: FeedForward) -> None:
    _linear(f.w_1, given.W1.T, given.b1)
    _linear(f.w_2, given.W2.T, given.b2)


@torch.no_grad()
def load_paper_params(model: nn.Module, params: PaperParams, positions: Tensor | None = None) -> None:
    """Copy params into the reference (built at the model's config, embeddings untied where the model's are not);
    what the model lacks is loaded as the neutral value (a bias of 0, a gain of 1). `positions` replaces the table the
    reference adds (the oracle's choice, see invariants/properties/oracle.py); extras are not loaded: the paper has no place for them."""
    check_shapes(params, model.config)
    model.src_embed.weight.copy_(params.source_embedding)
    model.tgt_embed.weight.copy_(params.target_embedding)
    model.generator.weight.copy_(params.pre_softmax)
    table = positions if positions is not None else params.positions.source
    if table is not None and model.pe.kind in ("sinusoidal", "learned"):
        use_positions(model, table)
    for layer, given in zip(model.encoder, params.encoder):
        _multi_head(layer.self_attn, given.self_attention)
        _norm(layer.res_attn.norm, given.norm_1)
        _ffn(layer.ffn, given.ffn)
        _norm(layer.res_ffn.norm, given.norm_2)
    for layer, given in zip(model.decoder, params.decoder):
        _multi_head(layer.self_attn, given.self_attention)
        _norm(layer.res_self.norm, given.norm_1)
        _multi_head(layer.cross_attn, given.cross_attention)
        _norm(layer.res_cross.norm, given.norm_2)
        _ffn(layer.ffn, given.ffn)
        _norm(layer.res_ffn.norm, given.norm_3)


@torch.no_grad()
def use_positions(model: nn.Module, table: Tensor) -> None:
    """Make the reference add `table` (its first rows; a shorter table leaves the rest of the reference's as it was)."""
    own = model.pe.fixed if model.pe.kind == "sinusoidal" else model.pe.learned.weight
    rows = min(own.size(0), table.size(0))
    own[:rows].copy_(table[:rows])


# -- sub-layer outputs, for localisation -------------------------------------------------------------------------


def sites(N: int) -> list[str]:
    """The names of the sub-layer outputs (and sub-layer inputs) in the order of the paper's computation (3.1)."""
    names = ["encoder.embedded"]
    for i in range(N):
        names += [f"encoder.{i}.{s}" for s in ("self_attention.input", "self_attention", "norm_1")]
        names += [f"encoder.{i}.{s}" for s in ("ffn.input", "ffn", "norm_2")]
    names += ["encoder.output", "decoder.embedded"]
    for i in range(N):
        names += [f"decoder.{i}.{s}" for s in ("self_attention.input", "self_attention", "norm_1")]
        names += [f"decoder.{i}.{s}" for s in ("cross_attention.input", "cross_attention.memory", "cross_attention")]
        names += [f"decoder.{i}.{s}" for s in ("norm_2", "ffn.input", "ffn", "norm_3")]
    return [*names, "decoder.output", "logits"]


def _first(args: tuple, kwargs: dict, position: int, *names: str) -> Tensor | None:
    """The tensor passed at `position` or under one of `names` (libraries call their modules either way)."""
    if len(args) > position and isinstance(args[position], Tensor):
        return args[position]
    return next((kwargs[n] for n in names if isinstance(kwargs.get(n), Tensor)), None)


@contextmanager
def sublayer_recorder(hooks: Mapping[str, tuple[nn.Module, str]]) -> Iterator[dict[str, Tensor]]:
    """While open, records site -> tensor for hooks {site: (module, what)}, what being 'output' (the first output),
    'input' (the first argument, or hidden_states / query) or 'memory' (the second, or key_value_states / key)."""
    recorded: dict[str, Tensor] = {}

    def on_call(site: str, what: str):
        def hook(module, args, kwargs, output=None):
            if what == "output":
                value = output if isinstance(output, Tensor) else output[0]
            elif what == "input":
                value = _first(args, kwargs, 0, "hidden_states", "query", "input")
            else:
                value = _first(args, kwargs, 1, "key_value_states", "key")
            if value is not None:
                recorded[site] = value

        return hook

    with ExitStack() as stack:
        for site, (module, what) in hooks.items():
            if what == "output":
                handle = module.register_forward_hook(on_call(site, what), with_kwargs=True)
            else:
                handle = module.register_forward_pre_hook(on_call(site, what), with_kwargs=True)
            stack.callback(handle.remove)
        yield recorded


def reference_sublayers(model: nn.Module, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> dict:
    """The reference's sub-layer outputs at `sites`, recorded with forward hooks during one forward pass."""
    hooks: dict[str, tuple[nn.Module, str]] = {"encoder.embedded": (model.encoder[0], "input")}
    for stack, layers in (("encoder", model.encoder), ("decoder", model.decoder)):
        if stack == "decoder":
            hooks["decoder.embedded"] = (layers[0], "input")
        for i, layer in enumerate(layers):
            p = f"{stack}.{i}."
            residuals = (layer.res_attn, layer.res_ffn) if stack == "encoder" else (layer.res_self, layer.res_cross)
            hooks |= {
                p + "self_attention.input": (layer.self_attn, "input"),
                p + "self_attention": (layer.self_attn, "output"),
            }
            hooks |= {
                p + "norm_1": (residuals[0], "output"),
                p + "ffn.input": (layer.ffn, "input"),
                p + "ffn": (layer.ffn, "output"),
            }
            if stack == "encoder":
                hooks[p + "norm_2"] = (layer.res_ffn, "output")
            else:
                hooks |= {p + "cross_attention.input": (layer.cross_attn, "input")}
                hooks |= {p + "cross_attention.memory": (layer.cross_attn, "memory")}
                hooks |= {p + "cross_attention": (layer.cross_attn, "output"), p + "norm_2": (residuals[1], "output")}
                hooks[p + "norm_3"] = (layer.res_ffn, "output")
    hooks["decoder.output"] = (model.generator, "input")
    with sublayer_recorder(hooks) as recorded:
        recorded["encoder.output"] = memory = model.encode(src, src_pad)
        recorded["logits"] = model.decode(tgt, memory, src_pad, tgt_pad)
    return recorded
