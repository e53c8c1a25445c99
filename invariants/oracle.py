"""Invariant 10: the paper as an oracle. The model's own weights, handed over in the paper's layout
(model/paper_params.py), are loaded into the reference at the model's config; in float64 and eval mode the two must
agree on the encoder's output, the decoder's logits, the whole forward pass and cached decoding, on drawn batches.

Where they differ, the sub-layers are compared one by one with the same input fed to both: the model's own output of
the sub-layer before (from `paper_sublayers`) enters the paper's next one, so each sub-layer is judged on its own, and
the report names the first that departs, with its equation or section and the size of the difference, and every other
that departs. A model without `paper_params` gets these checks not applicable; one without `paper_sublayers` gets its
verdict with "could not localise".

Positions: a sinusoidal table the model holds is judged against section 3.5's formula at float32 precision
(tol.PE_VALUES: most models, the reference too, keep it in float32) and, if it passes, used as is, so that everything
after it compares at float64 precision; a table that departs is replaced by the formula, and the outputs then differ.
A learned table (Table 3 row E) is used as is and reported.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import invariant
from invariants.subject import OWN_CONFIG, Overrides, Refused, Subject, random_batch, relative_error
from model.batch import Batch
from model.config import TransformerConfig
from model.layers import embedding_scale, sinusoidal_table
from model.paper_params import PaperParams, check_shapes, load_paper_params, storage, use_positions
from model.protocol import Seq2SeqModel
from model.table3 import table3_rows
from model.transformer import Transformer, causal_mask, key_padding_allowed

GROUP = "10 the paper as an oracle"
NO_LAYOUT = "the model does not hand its weights over in the paper's layout (see docs/plugging-in.md)"
NO_SUBLAYERS = "could not localise: the model does not expose its sub-layers (paper_sublayers, docs/plugging-in.md)"
INPUT = "section 3.1: a sub-layer reads the previous one's output, LayerNorm(x + Sublayer(x))"
WHERE = {  # the last part of a site's name -> the paper's equation or section
    "embedded": "sections 3.4 and 3.5: the token embedding times sqrt(d_model) plus the positional encoding",
    "self_attention.input": INPUT,
    "cross_attention.input": INPUT,
    "ffn.input": INPUT,
    "self_attention": "eq. (1) and section 3.2.2: multi-head scaled dot-product attention",
    "cross_attention.memory": "section 3.2.3: encoder-decoder attention takes keys and values from the encoder output",
    "cross_attention": "eq. (1) and section 3.2.2: multi-head scaled dot-product attention over the memory",
    "norm": "section 3.1: LayerNorm(x + Sublayer(x))",
    "ffn": "eq. (2): FFN(x) = max(0, x W1 + b1) W2 + b2",
    "encoder.output": "section 3.1: the encoder's output is its last layer's",
    "decoder.output": "section 3.1: the decoder's last layer's output enters the pre-softmax linear",
    "logits": "section 3.4: the pre-softmax linear, x times the embedding matrix transposed",
}


def reference_for(params: PaperParams, cfg: TransformerConfig, dtype: torch.dtype = torch.float64) -> Transformer:
    """A reference Transformer at cfg holding params: built on the meta device and filled, so that no random
    initialisation is spent on weights that are overwritten (seconds at the base size)."""
    cfg = cfg.replace(share_embeddings=params.shared(), P_drop=0.0)
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device=params.pre_softmax.device).to(dtype).eval()
    if cfg.pe == "sinusoidal":  # the reference's own table, as it builds it (float32); the oracle may replace it
        model.pe.fixed = sinusoidal_table(cfg.max_len, cfg.d_model).float().to(dtype)
    load_paper_params(model, params)
    return model


def where(site: str) -> str:
    """The paper's equation or section for a site name of model.paper_params.sites."""
    if site in WHERE:
        return WHERE[site]
    tail = site.split(".", 2)[-1]
    return WHERE["norm"] if tail.startswith("norm_") else WHERE.get(tail, WHERE.get(site.split(".")[-1], "?"))


@dataclass(frozen=True)
class Oracle:
    """The reference holding a model's weights, the positional table it adds in each stack, and what was noted."""

    reference: Transformer
    source_positions: Tensor | None
    target_positions: Tensor | None
    findings: tuple[str, ...]
    limit: tol.Tolerance = tol.ORACLE  # a sub-layer departs beyond it (ORACLE's float32 variant for a float32 model)


_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its reference, refilled per case


def own_table(model: Seq2SeqModel, cfg) -> Tensor | None:
    """The sinusoids the model adds, as its positional_table gives them (a float32 table is rounded its own way, which
    the formula's float64 values would call a departure at 1e-8); None where the model does not offer it."""
    if "positional_table" in (getattr(model, "unsupported", None) or {}):
        return None
    try:
        table = model.positional_table(cfg.max_len)
    except Exception:  # noqa: BLE001 - a member that fails is the contract check's finding; the formula serves here
        return None
    return table.detach() if isinstance(table, Tensor) and table.shape == (cfg.max_len, cfg.d_model) else None


def positions(
    params: PaperParams, cfg, observed: Tensor | None = None
) -> tuple[Tensor | None, Tensor | None, list[str]]:
    """The tables the reference adds to source and target, and the findings about the model's positions; a sinusoidal
    table the layout leaves out is the one the model says it adds (`observed`), else the formula's."""
    given = params.positions
    if given.kind == "learned":
        two = given.source is not None and given.target is not None and storage(given.source) != storage(given.target)
        return (
            given.source,
            given.target,
            [
                "positions learned (Table 3 row E), not section 3.5's sinusoids"
                + (", one table per stack" if two else "")
            ],
        )
    if given.kind != "sinusoidal":
        return None, None, ["no positional encoding (section 3.5 adds one)"]
    exact = sinusoidal_table(cfg.max_len, cfg.d_model)
    chosen, findings = [], []
    source = given.source if given.source is not None else observed
    target = given.target if given.target is not None else observed
    for stack, table in (("source", source), ("target", target)):
        if table is None:
            chosen.append(exact)
            continue
        rows = min(table.size(0), exact.size(0))
        off = (table[:rows].double().cpu() - exact[:rows]).abs().max().item()
        if tol.PE_VALUES.violated(off):
            findings.append(f"the {stack} positional table departs from section 3.5's sinusoids by {off:.3g}")
        chosen.append(exact if tol.PE_VALUES.violated(off) else table)
    return chosen[0], chosen[1], findings


def oracle_for(model: Seq2SeqModel, limit: tol.Tolerance = tol.ORACLE) -> Oracle:
    """The reference at the model's config with the model's current weights (float64, eval mode)."""
    params = model.paper_params()
    cfg = model.config.replace(pe=params.positions.kind)
    check_shapes(params, cfg)
    observed = own_table(model, cfg) if params.positions.kind == "sinusoidal" else None
    source, target, findings = positions(params, cfg, observed)
    reference = _REFERENCES.get(model)
    if reference is None or reference.config.share_embeddings != params.shared():
        reference = _REFERENCES[model] = reference_for(params, cfg)
    else:
        load_paper_params(reference, params)
    findings += [f"the model lacks the paper's {path}" for path in params.missing()]
    if params.extras:
        findings.append(f"parameters beyond the paper: {', '.join(params.extras)}")
    return Oracle(reference, source, target, tuple(findings), limit)


def paper_encode(o: Oracle, src: Tensor, src_pad: Tensor) -> Tensor:
    if o.source_positions is not None:
        use_positions(o.reference, o.source_positions)
    return o.reference.encode(src, src_pad)


def paper_decode(o: Oracle, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
    if o.target_positions is not None:
        use_positions(o.reference, o.target_positions)
    return o.reference.decode(tgt, memory, src_pad, tgt_pad)


def gap(got: Tensor, expected: Tensor, pad: Tensor) -> float:
    """relative_error over the positions that are not padding (what a pad position holds is not the paper's)."""
    keep = ~pad.to(got.device)
    return relative_error(got[keep].double(), expected[keep].double())


@dataclass(frozen=True)
class Departure:
    """A sub-layer whose output, from the model's own input, differs from the paper's."""

    site: str
    error: float
    detail: str = ""  # what else is wrong with it (a shape)

    def __str__(self) -> str:
        return f"{self.site} ({where(self.site)}) by {self.error:.3g}{': ' + self.detail if self.detail else ''}"


def localise(model: Seq2SeqModel, o: Oracle, b: Batch) -> list[Departure] | None:
    """Each sub-layer of the paper fed the model's own input to it; None when the model exposes no sub-layers."""
    record = getattr(model, "paper_sublayers", None)
    if not callable(record):
        return None
    try:
        seen = record(b.src, b.tgt, b.src_pad, b.tgt_pad)
    except NotImplementedError:
        return None
    ref, departures = o.reference, []

    def site(name: str, expected: Tensor, pad: Tensor) -> Tensor:
        got = seen.get(name)
        if got is None:  # not exposed: the paper's value goes on
            return expected
        if got.shape != expected.shape:  # e.g. keys and values read from the wrong stack: the paper's goes on
            departures.append(
                Departure(name, float("inf"), f"shape {tuple(got.shape)}, the paper's {tuple(expected.shape)}")
            )
            return expected
        error = gap(got, expected, pad)
        if o.limit.violated(error):
            departures.append(Departure(name, error))
        return got

    def self_attention(p: str, x: Tensor, attention, residual, allowed: Tensor, pad: Tensor) -> Tensor:
        """LayerNorm(x + SelfAttention(x)) (section 3.1), each step from the model's own input to it."""
        q = site(p + "self_attention.input", x, pad)
        return site(p + "norm_1", residual.norm(x + site(p + "self_attention", attention(q, q, allowed), pad)), pad)

    def feed_forward(p: str, x: Tensor, layer, norm: str, pad: Tensor) -> Tensor:
        """LayerNorm(x + FFN(x)) (eq. 2 in section 3.1's sub-layer connection)."""
        f = site(p + "ffn", layer.ffn(site(p + "ffn.input", x, pad)), pad)
        return site(p + norm, layer.res_ffn.norm(x + f), pad)

    scale = embedding_scale(ref.config.d_model)
    src_allowed = key_padding_allowed(b.src_pad)  # the encoder's keys, and the cross-attention's: the same source
    T = b.tgt.size(1)
    self_allowed = causal_mask(T, T, 0) & key_padding_allowed(b.tgt_pad)
    if o.source_positions is not None:
        use_positions(ref, o.source_positions)
    x = site("encoder.embedded", ref.pe(ref.src_embed(b.src) * scale), b.src_pad)
    for i, layer in enumerate(ref.encoder):
        x = self_attention(f"encoder.{i}.", x, layer.self_attn, layer.res_attn, src_allowed, b.src_pad)
        x = feed_forward(f"encoder.{i}.", x, layer, "norm_2", b.src_pad)
    memory = site("encoder.output", x, b.src_pad)
    if o.target_positions is not None:
        use_positions(ref, o.target_positions)
    y = site("decoder.embedded", ref.pe(ref.tgt_embed(b.tgt) * scale), b.tgt_pad)
    for i, layer in enumerate(ref.decoder):
        p = f"decoder.{i}."
        y = self_attention(p, y, layer.self_attn, layer.res_self, self_allowed, b.tgt_pad)
        q = site(p + "cross_attention.input", y, b.tgt_pad)
        m = site(p + "cross_attention.memory", memory, b.src_pad)
        a = site(p + "cross_attention", layer.cross_attn(q, m, src_allowed), b.tgt_pad)
        y = site(p + "norm_2", layer.res_cross.norm(y + a), b.tgt_pad)
        y = feed_forward(p, y, layer, "norm_3", b.tgt_pad)
    y = site("decoder.output", y, b.tgt_pad)
    site("logits", ref.generator(y), b.tgt_pad)
    return departures


def note(error: float, model: Seq2SeqModel, o: Oracle, b: Batch) -> str:
    """The localisation (on a departure) and the findings about the model's parameters, for the report."""
    parts = []
    if o.limit.violated(error):
        departures = localise(model, o, b)
        if departures is None:
            parts.append(NO_SUBLAYERS)
        elif departures:
            parts.append(f"first departs at {departures[0]}")
            if len(departures) > 1:
                parts.append("also at " + ", ".join(f"{d.site} ({d.error:.3g})" for d in departures[1:9]))
        else:
            parts.append("every sub-layer agrees with the paper's on its own input: the stacks' wiring differs")
    return "; ".join([*parts, *o.findings])


# -- the cases -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleCase:
    """A batch on a config: padding 'none', 'right' (source and target) or 'left' (ragged rows, row 0 full). Left
    padding is the source's only: targets are right-padded, as the protocol has them (a decoder that lets a real
    query see the pad keys before it, which no right-padded batch has, is not wrong)."""

    config: Overrides
    batch: int
    src_len: int
    tgt_len: int
    padding: str
    seed: int
    row: str = ""  # the Table 3 row whose config this is, scaled down ('' : a drawn or the spec's own config)
    weights: str = "initial"  # "initial", or "randomised" (randomise below): every parameter away from its init

    def make_batch(self, model: Seq2SeqModel) -> Batch:
        b = random_batch(model.config, self.batch, self.src_len, self.tgt_len, self.padding != "none", self.seed)
        if self.padding == "left":
            return Batch(b.src.flip(1), b.tgt, b.src_pad.flip(1), b.tgt_pad)
        return b


@st.composite
def oracle_cases(draw: st.DrawFn, padding: tuple[str, ...] = ("none", "right", "left")) -> OracleCase:
    """Small configs whose max_len is drawn too, and lengths from 1 up to it: short ones, and the longest."""
    max_len = draw(st.sampled_from([4, 16, 64]))
    config = {**draw(small_configs()), "max_len": max_len}
    length = st.one_of(st.integers(1, min(8, max_len)), st.integers(1, max_len), st.just(max_len))
    return OracleCase(
        config,
        draw(st.integers(1, 3)),
        draw(length),
        draw(length),
        draw(st.sampled_from(padding)),
        draw(st.integers(0, 2**16)),
        weights=draw(st.sampled_from(("initial", "randomised"))),
    )


def pinned_cases(subject: Subject) -> list[OracleCase]:
    """The spec's own config (the 65M base model) on short lengths, padded on the model's side, then Table 3's rows."""
    side = subject.padding_sides[0]
    return [
        OracleCase(OWN_CONFIG, 2, 6, 5, side, 0),
        OracleCase(OWN_CONFIG, 2, 6, 5, side, 1, weights="randomised"),
        *table3_cases(subject),
    ]


TABLE3_SCALE = 16  # each Table 3 row's d_model, d_ff, d_k, d_v over this (base: d_model 32, h 8, d_k 4): ratios kept


def table3_configs() -> list[tuple[str, Overrides]]:
    """Every Table 3 row's config at 1/TABLE3_SCALE of its sizes: the same h, N and PE, h d_k against d_model (rows B
    break h d_k = d_model), d_ff against d_model; P_drop and eps_ls as the row has them, since a model is built for
    the row it trains, and may build differently for them."""
    configs = []
    for row in table3_rows():
        cfg = row.config()
        sizes = {k: getattr(cfg, k) // TABLE3_SCALE for k in ("d_model", "d_ff", "d_k", "d_v")}
        same = {k: getattr(cfg, k) for k in ("N", "h", "P_drop", "eps_ls", "pe")}
        configs.append((row.name, {**same, **sizes, "vocab_size": 50, "max_len": 16}))
    return configs


def table3_cases(subject: Subject) -> list[OracleCase]:
    """One short padded batch at each Table 3 row's config that the model accepts: a row whose config it refuses
    (ValueError, NotImplementedError: torch.nn.Transformer cannot build h d_k != d_model) it cannot be trained at."""
    cases = []
    for name, config in table3_configs():
        try:
            subject.model(config)
        except Refused:
            continue
        cases.append(OracleCase(config, 2, 6, 5, subject.padding_sides[0], 0, name))
    return cases


def hands_over_weights(subject: Subject) -> str | None:
    """Not applicable, with the reason, when the model has no paper_params (or it raises NotImplementedError)."""
    model = subject.model(OWN_CONFIG)
    if not callable(getattr(model, "paper_params", None)):
        return NO_LAYOUT
    try:
        model.paper_params()
    except NotImplementedError as exc:
        return f"{NO_LAYOUT}: {exc}"
    return None


MATRIX_GAIN = 4.0  # trainable matrices times this: FFN pre-activations reach ~10, where ReLU6 and GELU leave ReLU
VECTOR_SPREAD = 0.5  # the std of what is added to trainable vectors: biases away from 0, LayerNorm gains from 1


def randomise(model: Seq2SeqModel, seed: int) -> Seq2SeqModel:
    """The model with weights that show every parameter's role (it is changed in place and returned): at the
    initial weights biases are 0, LayerNorm gains 1 and pre-activations small, so a bias added in the wrong place, a
    gain ignored or a ReLU that saturates at 6 computes the paper's function there. Trainable matrices are scaled up,
    trainable vectors moved by noise; fixed tables (sinusoids held as frozen parameters) are left as they are."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if not (p.requires_grad and p.is_floating_point()):
                continue
            if p.dim() >= 2:
                p.mul_(MATRIX_GAIN)
            else:
                p.add_(VECTOR_SPREAD * torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device))
    return model


def prepared(subject: Subject, case: OracleCase) -> tuple[Seq2SeqModel, Oracle, Batch]:
    if case.weights == "randomised":
        model = randomise(subject.fresh(case.config), case.seed).eval()
    else:
        model = subject.model(case.config).eval()
    limit = tol.ORACLE.at(subject.downcast("forward") is not None)
    return model, oracle_for(model, limit), case.make_batch(model)


def oracle_property(needs: tuple[str, ...] = (), padding: tuple[str, ...] = ("none", "right", "left")):
    return invariant(
        GROUP,
        tol.ORACLE,
        pinned=pinned_cases,
        cases=lambda s: oracle_cases(tuple(p for p in padding if p == "none" or p in s.padding_sides)),
        needs=needs,
        applicable=hands_over_weights,
    )


@oracle_property()
def oracle_encoder(subject: Subject, case: OracleCase) -> tuple[float, str]:
    """The encoder's output equals the paper's encoder holding the model's own weights (float64, eval; sections 3.1-3.5)."""
    model, o, b = prepared(subject, case)
    error = gap(model.encode(b.src, b.src_pad), paper_encode(o, b.src, b.src_pad), b.src_pad)
    return error, note(error, model, o, b)


@oracle_property()
def oracle_decoder(subject: Subject, case: OracleCase) -> tuple[float, str]:
    """Given the same memory, the decoder's logits equal the paper's decoder's holding the model's own weights (float64, eval)."""
    model, o, b = prepared(subject, case)
    memory = model.encode(b.src, b.src_pad)
    got = model.decode(b.tgt, memory, b.src_pad, b.tgt_pad)
    error = gap(got, paper_decode(o, b.tgt, memory, b.src_pad, b.tgt_pad), b.tgt_pad)
    return error, note(error, model, o, b)


@oracle_property()
def oracle_logits(subject: Subject, case: OracleCase) -> tuple[float, str]:
    """The whole forward pass's logits equal the paper's Transformer's holding the model's own weights (float64, eval)."""
    model, o, b = prepared(subject, case)
    expected = paper_decode(o, b.tgt, paper_encode(o, b.src, b.src_pad), b.src_pad, b.tgt_pad)
    error = gap(model(b.src, b.tgt, b.src_pad, b.tgt_pad), expected, b.tgt_pad)
    return error, note(error, model, o, b)


@oracle_property(needs=("kv_cache",), padding=("none", "right"))
def oracle_cached_decoding(subject: Subject, case: OracleCase) -> tuple[float, str]:
    """Decoding with the KV cache in random chunks gives the paper's decoder's logits (float64, eval; target unpadded)."""
    model, o, b = prepared(subject, case)
    b = Batch(b.src, b.tgt, b.src_pad, torch.zeros_like(b.tgt_pad))  # the cache assumes right padding: full rows
    memory = model.encode(b.src, b.src_pad)
    cache, steps, t = model.new_cache(), [], 0
    gen = torch.Generator().manual_seed(case.seed)
    while t < case.tgt_len:
        n = int(torch.randint(1, case.tgt_len - t + 1, (1,), generator=gen))
        steps.append(model.decode(b.tgt[:, t : t + n], memory, b.src_pad, b.tgt_pad[:, t : t + n], cache))
        t += n
    expected = paper_decode(o, b.tgt, memory, b.src_pad, b.tgt_pad)
    error = gap(torch.cat(steps, dim=1), expected, b.tgt_pad)
    return error, note(error, model, o, b)
