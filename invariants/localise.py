"""Where a model departs from the paper: its sub-layers compared one by one with the paper's, each fed the model's own
input to it (the model's output of the sub-layer before, from `paper_sublayers`), so that each is judged on its own;
the first that departs is named with its equation or section. The model's member is run apart from the verdict: if it
is missing, raises or returns the wrong type, the oracle's failure stands with "could not localise" and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from invariants import tolerances as tol
from invariants.guard import harness_stop, member_at_fault
from invariants.pristine import pristine
from invariants.subject import relative_error
from model.batch import Batch
from model.layers import embedding_scale
from model.paper_params import sites, use_positions
from model.protocol import Seq2SeqModel
from model.transformer import Transformer, causal_mask, key_padding_allowed


@dataclass(frozen=True)
class Oracle:
    """The reference holding a model's weights, the positional table it adds in each stack, and what was noted."""

    reference: Transformer
    source_positions: Tensor | None
    target_positions: Tensor | None
    findings: tuple[str, ...]
    limit: tol.Tolerance = tol.ORACLE  # a sub-layer departs beyond it (ORACLE's float32 variant for a float32 model)


ALIASES = (".input", ".memory", "encoder.output", "decoder.output")  # sites that repeat the output of the site before
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


def where(site: str) -> str:
    """The paper's equation or section for a site name of model.paper_params.sites."""
    if site in WHERE:
        return WHERE[site]
    tail = site.split(".", 2)[-1]
    return WHERE["norm"] if tail.startswith("norm_") else WHERE.get(tail, WHERE.get(site.split(".")[-1], "?"))


def gap(got: Tensor, expected: Tensor, pad: Tensor) -> float:
    """relative_error over the positions that are not padding (what a pad position holds is not the paper's)."""
    keep = ~pad.to(got.device)
    return relative_error(got[keep].double(), expected[keep].double())


@dataclass(frozen=True)
class Departure:
    """A sub-layer whose output, from the model's own input, differs from the paper's."""

    site: str
    error: float
    detail: str = ""  # what else is wrong with it (a shape, a normalised input)
    after: str = ""  # the last exposed site that agreed, where sites between it and this one are not exposed

    def __str__(self) -> str:
        return f"{self.site} ({where(self.site)}) by {self.error:.3g}{': ' + self.detail if self.detail else ''}"

    def placed(self) -> str:
        """'at SITE (...)', or 'between AFTER and SITE (...)' where the model exposes no site between them."""
        return f"between {self.after} and {self}" if self.after else f"at {self}"


def pre_normalised(name: str, got: Tensor, expected: Tensor, pad: Tensor) -> str:
    """Where a sub-layer's input departs: whether it is the paper's input normalised (a LayerNorm before the sub-layer,
    the pre-LN order), else ''."""
    if not name.endswith(".input"):
        return ""
    standard = (expected - expected.mean(-1, keepdim=True)) / expected.std(-1, unbiased=False, keepdim=True)
    if gap(got, standard, pad) < 1e-3:
        return "the input is the paper's input normalised: a LayerNorm before the sub-layer (pre-LN), not after it"
    return ""


def unknown_sites(model: Seq2SeqModel, b: Batch) -> str:
    """paper_sublayers' site names that model.paper_params.sites does not have, in one line ('' when none)."""
    seen = recorded(model, b)
    if isinstance(seen, str):
        return ""
    known = set(sites(model.config.N))
    unknown = [str(name) for name in seen if name not in known]
    return (
        f"paper_sublayers gave sites the paper's layout does not name, left out: {', '.join(unknown[:6])} "
        "(model.paper_params.sites lists them)"
        if unknown
        else ""
    )


def recorded(model: Seq2SeqModel, b: Batch) -> Mapping[str, Tensor] | str:
    """The model's sub-layer outputs (paper_sublayers), or why there are none to compare: the member is missing, says
    NotImplementedError, raises or returns something else than a mapping. Whatever it does, the verdict stands."""
    record = getattr(model, "paper_sublayers", None)
    if not callable(record):
        return NO_SUBLAYERS
    try:
        seen = record(b.src, b.tgt, b.src_pad, b.tgt_pad)
    except NotImplementedError:
        return NO_SUBLAYERS
    except BaseException as exc:  # noqa: BLE001 - the member's failure is said, the verdict kept
        if harness_stop(exc):
            raise
        where = member_at_fault(exc, innermost=True)
        return f"could not localise: paper_sublayers raised {type(exc).__name__}: {str(exc)[:120]}" + (
            f" in {where}" if where else ""
        )
    if not isinstance(seen, Mapping):
        return (
            f"could not localise: paper_sublayers returned a {type(seen).__name__}; it must return a mapping of site "
            "names (model.paper_params.sites) to tensors"
        )
    return seen


def localise(model: Seq2SeqModel, o: Oracle, b: Batch) -> list[Departure] | str:
    """Each sub-layer of the paper fed the model's own input to it, in the order of the stacks; the departures, or
    (a string) why the model's sub-layers cannot be compared. Where the model exposes only some sites, a departure is
    placed between the last exposed site that agreed and the first that departs."""
    seen = recorded(model, b)
    if isinstance(seen, str):
        return seen
    with pristine():
        return _compare(seen, o, b)


def _compare(seen: Mapping[str, Tensor], o: Oracle, b: Batch) -> list[Departure]:
    ref, departures = o.reference, []
    agreed = [""]  # the last exposed site that agreed with the paper's
    skipped = [False]  # whether a site was passed over (not exposed) since then

    def site(name: str, expected: Tensor, pad: Tensor) -> Tensor:
        got = seen.get(name)
        if not isinstance(got, Tensor):  # not exposed: the paper's value goes on
            # a gap, unless the site is another's output under a second name (an input, the memory, a stack's output)
            skipped[0] = skipped[0] or not name.endswith(ALIASES)
            return expected
        after = agreed[0] if skipped[0] and not departures else ""
        if got.shape != expected.shape:  # e.g. keys and values read from the wrong stack: the paper's goes on
            departures.append(
                Departure(name, float("inf"), f"shape {tuple(got.shape)}, the paper's {tuple(expected.shape)}", after)
            )
            return expected
        error = gap(got, expected, pad)
        if o.limit.violated(error):
            departures.append(Departure(name, error, pre_normalised(name, got, expected, pad), after))
        elif not departures:
            agreed[0], skipped[0] = name, False
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
        if isinstance(departures, str):
            parts.append(departures)
        elif departures:
            parts.append(f"first departs {departures[0].placed()}")
            if len(departures) > 1:
                parts.append("also at " + ", ".join(f"{d.site} ({d.error:.3g})" for d in departures[1:9]))
        else:
            parts.append("every sub-layer agrees with the paper's on its own input: the stacks' wiring differs")
        unknown = unknown_sites(model, b)
        if unknown:
            parts.append(unknown)
    return "; ".join([*parts, *o.findings])
