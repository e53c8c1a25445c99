"""The paper as an oracle. The model's own weights, handed over in the paper's layout
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
from invariants.groups import ORACLE
from invariants.localise import NO_SUBLAYERS, Oracle, gap, localise, note  # noqa: F401  (localise: the tests')
from invariants.pristine import pristine
from invariants.subject import OWN_CONFIG, Overrides, Refused, Subject, random_batch
from model.batch import Batch
from model.config import TransformerConfig
from model.layers import sinusoidal_table
from model.paper_params import PaperParams, check_shapes, leaves, load_paper_params, storage, use_positions
from model.protocol import Seq2SeqModel
from model.table3 import table3_rows
from model.transformer import Transformer

NO_LAYOUT = "the model does not hand its weights over in the paper's layout (see docs/plugging-in.md)"


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
    if not isinstance(params, PaperParams):
        raise ValueError(
            f"paper_params returned a {type(params).__name__}; it must return a model.paper_params.PaperParams "
            "(docs/plugging-in.md, the paper's layout)"
        )
    on_meta = [path for path, value in leaves(params) if isinstance(value, Tensor) and value.is_meta]
    if on_meta:
        raise ValueError(
            f"paper_params returned tensors on the meta device, which hold no values ({', '.join(on_meta[:3])}); "
            "return the model's own weights"
        )
    cfg = model.config.replace(pe=params.positions.kind)
    check_shapes(params, cfg)
    observed = own_table(model, cfg) if params.positions.kind == "sinusoidal" else None
    source, target, findings = positions(params, cfg, observed)
    reference = _REFERENCES.get(model)
    if reference is None or reference.config.share_embeddings != params.shared():
        reference = _REFERENCES[model] = reference_for(params, cfg)
    else:
        load_paper_params(reference, params)
    with pristine() as patched:
        if patched:
            findings.append(
                f"torch functions changed since the harness was imported: {', '.join(patched[:4])}; the paper's side "
                "runs with the originals"
            )
    findings += [f"the model lacks the paper's {path}" for path in params.missing()]
    if params.extras:
        findings.append(f"parameters beyond the paper: {', '.join(params.extras)}")
    return Oracle(reference, source, target, tuple(findings), limit)


def paper_encode(o: Oracle, src: Tensor, src_pad: Tensor) -> Tensor:
    """The paper's encoder output, computed with torch as it was before the adapter was imported (pristine.py)."""
    if o.source_positions is not None:
        use_positions(o.reference, o.source_positions)
    with pristine():
        return o.reference.encode(src, src_pad)


def paper_decode(o: Oracle, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
    """The paper's logits given a memory, computed with torch as it was before the adapter was imported."""
    if o.target_positions is not None:
        use_positions(o.reference, o.target_positions)
    with pristine():
        return o.reference.decode(tgt, memory, src_pad, tgt_pad)


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
        OracleCase(RANDOMISED_CONFIG, 2, 6, 5, side, 1, weights="randomised"),
        *table3_cases(subject),
    ]


# The pinned case at randomised weights: a small config (a copy of the 65M model costs seconds a property), with
# d_ff 4 d_model as the paper's; drawn cases add randomised weights at other small configs.
RANDOMISED_CONFIG = {"N": 2, "d_model": 32, "h": 4, "d_k": 8, "d_v": 8, "d_ff": 128, "vocab_size": 50, "max_len": 16}


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
        ORACLE,
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


@invariant(ORACLE, tol.COUNT, pinned=lambda s: [OWN_CONFIG], applicable=hands_over_weights)
def paper_parameters(subject: Subject, config: Overrides) -> tuple[float, str]:
    """The model holds the paper's parameters, no fewer and no more: FFN and LayerNorm biases, no pre-softmax bias, no learned scale on the positions (paper, sections 3.1-3.5).

    Read from the model's own paper_params(): what the paper has and the layout leaves empty, and what the model
    holds beyond it (`extras`); each is named. Counted: the parameters that differ. Attention biases are the one
    choice the paper leaves open (section 3.2.2 writes projections, and libraries differ); they count neither way.
    """
    params = subject.model(config).paper_params()
    if not isinstance(params, PaperParams):
        raise ValueError(f"paper_params returned a {type(params).__name__}; it must return a PaperParams")
    lacks, adds = params.missing(), list(params.extras)
    notes = [f"lacks {', '.join(lacks[:6])}{' and more' if len(lacks) > 6 else ''}"] if lacks else []
    notes += [f"adds {', '.join(adds[:6])}{' and more' if len(adds) > 6 else ''}"] if adds else []
    return len(lacks) + len(adds), "; ".join(notes)
