"""The position-wise feed-forward networks are eq. (2), FFN(x) = max(0, x W1 + b1) W2 + b2: non-linear
(`ffn_nonlinear`), and with max(0, z) as their activation (`ffn_relu`).

`ffn_nonlinear`: on sequences of length 1 every attention is an affine map (a softmax over one key is 1), so in eval
mode the only non-linear steps left are the FFNs' activations and the normalisations. A normalisation maps its input to
a linear function of it times one scalar (1 / its std), which adds at most one dimension to the affine span of
a set of vectors. Feed source embeddings on a circle (affine dimension 2) through the encoder: without an
activation the outputs span at most 2 + (number of normalisations) affine dimensions, 2N from section 3.1 plus
an allowance of 2 for an embedding or final LayerNorm. With ReLU each unit switches on and off around the
circle (its radius dwarfs the biases and the positional encoding, so every pre-activation changes sign), and
the kinks add dimensions. The decoder is probed the same way, its length-1 target embeddings on a circle and
one fixed length-1 memory (cross-attention to a single key is then a constant), with 3N + 2 normalisations.

`ffn_relu` changes the FFNs' own parameters in the cached model and puts them back exactly: the matrices with one axis
of d_ff (section 3.3's inner-layer width) and one of d_model, W1 the one beside a d_ff-long bias b1. max(0, z) is
positively homogeneous, so W1 and b1 times c with W2 divided by c compute the same FFN for every c > 0 (for c = 4 and
1/4 to the last bit); GELU and SiLU are not, and the logits move. It is also 0 below 0, so with b1 lowered beyond
every pre-activation each FFN outputs b2 alone, and lowering it further changes nothing; a leaky ReLU's negative side,
or a missing activation, moves with it. Only multiples of max(0, z) do both.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.groups import FEED_FORWARD
from invariants.guard import Skipped
from invariants.subject import OWN_CONFIG, Overrides, Subject, random_batch, relative_error
from model.protocol import Seq2SeqModel
from model.registry import format_config_overrides

EXTRA_NORMS = 2  # an embedding LayerNorm and a final LayerNorm that some correct models add
RADIUS = 10.0  # of the input circle, in units of a unit-variance embedding: far above biases and PE entries (<= 1)


def affine_span_excess(rows: Tensor, bound: int) -> float:
    """Singular value number bound + 1 of the centred rows, relative to the largest: ~1e-16 if the rows span <= bound affine dimensions."""
    values = torch.linalg.svdvals(rows - rows.mean(0))
    return (values[bound] / values[0]).item() if values[0] > 0 else 0.0


def normalisation_bounds(N: int) -> tuple[int, int]:
    """The affine dimensions a circle reaches through the encoder and through the decoder when only normalisations bend it."""
    return 2 + 2 * N + EXTRA_NORMS, 2 + 3 * N + EXTRA_NORMS


def wide_enough(config: Overrides) -> bool:
    """Outputs on the (d_model - 1)-dimensional LayerNorm sphere can exceed the decoder's bound."""
    return config["d_model"] - 1 > normalisation_bounds(config["N"])[1]


@invariant(
    FEED_FORWARD,
    tol.NONLINEAR,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs().filter(wide_enough), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
)
def ffn_nonlinear(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """Along a circle of length-1 inputs, encoder outputs and logits span more dimensions than normalisation alone can add: the FFNs are non-linear (paper, eq. 2)."""
    config, seed = case
    model = subject.model(config).eval()
    cfg = model.config
    encoder_bound, decoder_bound = normalisation_bounds(cfg.N)
    if cfg.d_model - 1 <= decoder_bound or cfg.vocab_size <= decoder_bound + 1:
        raise NotApplicable(
            f"d_model={cfg.d_model} or vocab_size={cfg.vocab_size} leaves no room above "
            f"{decoder_bound} affine dimensions, all that normalisation can reach at N={cfg.N}"
        )
    gen = torch.Generator().manual_seed(seed)
    plane = torch.randn(2, cfg.d_model, generator=gen, dtype=torch.float64)
    points = max(64, 4 * (decoder_bound + 2))
    angles = torch.arange(points, dtype=torch.float64) * (2 * torch.pi / points)
    circle = (RADIUS * torch.stack([angles.cos(), angles.sin()], 1) @ plane)[:, None, :]
    pad = torch.zeros(points, 1, dtype=torch.bool)

    def excesses() -> tuple[float, float]:
        memory = model.encode(circle, pad)
        logits = model.decode(circle, memory[:1].expand(points, 1, cfg.d_model), pad, pad)
        return affine_span_excess(memory[:, 0], encoder_bound), affine_span_excess(logits[:, 0], decoder_bound)

    encoder, decoder = excesses()
    # At a small init (HF's 0.02) the pre-activations stay near 0, where GELU is almost linear: W1 and b1 scaled up (W2
    # down, exact: a power of two) drive them to where the activation bends; a linear FFN stays linear either way.
    firsts, biases, seconds = feed_forward_parts(model)
    if not untold(model, firsts, seconds):
        with rescaled(firsts, biases, seconds, bending_gain(firsts, cfg.d_model)):
            encoder, decoder = (max(pair) for pair in zip((encoder, decoder), excesses()))
    flat = [
        f"{name} (at most {bound} affine dimensions)"
        for name, excess, bound in (
            ("encoder outputs", encoder, encoder_bound),
            ("decoder logits", decoder, decoder_bound),
        )
        if not excess >= tol.NONLINEAR.value
    ]
    return min(encoder, decoder), (
        f"{' and '.join(flat)}: only normalisation bends them (an FFN without its "
        f"activation, or a stack whose output has lost its input)"
        if flat
        else ""
    )


BEND = 4.0  # ffn_nonlinear: pre-activations brought to about this size, where GELU and SiLU bend as ReLU does


def bending_gain(firsts: list[Tensor], d_model: int) -> float:
    """The power of two (at least 1) that brings pre-activations of a LayerNorm output (norm sqrt(d_model)) through
    these W1 to a typical size of BEND."""
    typical = max(w.double().std().item() for w in firsts) * math.sqrt(d_model)
    return 2.0 ** max(0, round(math.log2(BEND / typical))) if typical > 0 else 1.0


RESCALE = 4.0  # a power of two: c z and z / c are exact in binary floating point, so ReLU's logits repeat bit for bit
SHIFT = 10  # b1 lowered by 10x a bound on the pre-activations of an input of a LayerNorm output's norm, sqrt(d_model)


def feed_forward_parts(model: Seq2SeqModel) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """(W1s, b1s, W2s) of the stacks' FFNs: the matrices with one axis of d_ff and the other of d_model (eq. 2);
    W1 is the one held beside a d_ff-long bias, b1, the other is W2."""
    cfg, groups = model.config, model.parameter_groups()
    owned = {id(p) for name in ("encoder", "decoder") for p in groups.get(name, [])}
    firsts, biases, seconds = [], [], []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) in owned]
        matrices = [p for p in own if p.dim() == 2 and sorted(p.shape) == sorted((cfg.d_ff, cfg.d_model))]
        bias = [p for p in own if p.dim() == 1 and p.numel() == cfg.d_ff]
        (firsts if bias else seconds).extend(matrices)
        biases.extend(bias if matrices else [])
    return firsts, biases, seconds


def untold(model: Seq2SeqModel, firsts: list[Tensor], seconds: list[Tensor]) -> str:
    """Why the FFNs' W1 and W2 are not told apart at this config ('' when they are): one of each per layer, 2N in all
    (section 3.1). At d_ff = d_model, 2 d_model or 3 d_model, attention projections (W^Q, a fused K/V or QKV) have
    an FFN matrix's shape and are counted with them."""
    cfg = model.config
    if len(firsts) == len(seconds) == 2 * cfg.N:
        return ""
    return (
        f"at d_ff={cfg.d_ff}, d_model={cfg.d_model} the matrices with one axis of d_ff and one of d_model are "
        f"{len(firsts)} beside a d_ff-long bias ({', '.join(named(model, firsts))}) and {len(seconds)} without "
        f"({', '.join(named(model, seconds))}), not W1 and W2 for each of the {2 * cfg.N} FFNs; at a d_ff that is not "
        "d_model, 2 d_model or 3 d_model (the widths of attention projections, fused or not) they are told apart"
    )


def named(model: Seq2SeqModel, tensors: list[Tensor]) -> list[str]:
    """The parameter names of these tensors, at most four, for a message."""
    names = {id(p): name for name, p in model.named_parameters()}
    shown = [names.get(id(t), "?") for t in tensors[:4]]
    return shown + ([f"{len(tensors) - 4} more"] if len(tensors) > 4 else []) or ["none"]


@contextmanager
def rescaled(firsts: list[Tensor], biases: list[Tensor], seconds: list[Tensor], c: float) -> Iterator[None]:
    """W1 and b1 times c, W2 divided by c, while open (c a power of two: put back exactly)."""
    with torch.no_grad():
        for p in [*firsts, *biases]:
            p.mul_(c)
        for p in seconds:
            p.div_(c)
        try:
            yield
        finally:
            for p in [*firsts, *biases]:
                p.div_(c)
            for p in seconds:
                p.mul_(c)


@contextmanager
def lowered(firsts: list[Tensor], biases: list[Tensor], d_model: int, times: float) -> Iterator[None]:
    """Every b1 lowered by `times` SHIFT-fold a bound on the pre-activations of inputs of norm sqrt(d_model), while open
    (then restored): |x W1 + b1| <= |x| |W1| + max |b1|."""
    saved = [b.detach().clone() for b in biases]
    bound = max(w.norm().item() for w in firsts) * math.sqrt(d_model) + max(b.abs().max().item() for b in biases)
    with torch.no_grad():
        for b in biases:
            b.sub_(times * SHIFT * (1 + bound))
        try:
            yield
        finally:
            for b, kept in zip(biases, saved):
                b.copy_(kept)


@invariant(
    FEED_FORWARD,
    tol.RELU,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs().map(lambda c: {**c, "d_ff": 4 * c["d_model"]}), st.integers(0, 2**16)),
)
def ffn_relu(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """W1 and b1 times 4 with W2 divided by 4 leave the logits unchanged, and so does b1 lowered further below every pre-activation: the FFNs' activation is max(0, z) (paper, eq. 2)."""
    config, seed = case
    model = subject.model(config).eval()
    cfg = model.config
    firsts, biases, seconds = feed_forward_parts(model)
    why = untold(model, firsts, seconds)
    if why:
        raise Skipped(f"config {format_config_overrides(config)}" if config else "the spec's own config", why)
    batch = random_batch(cfg, 2, 5, 4, True, seed)
    logits = batch.forward(model)
    moved = []
    for c in (RESCALE, 1 / RESCALE):
        with rescaled(firsts, biases, seconds, c):
            moved.append(relative_error(batch.forward(model), logits))
    with lowered(firsts, biases, cfg.d_model, 1.0):
        low = batch.forward(model)
    with lowered(firsts, biases, cfg.d_model, 2.0):
        dead = relative_error(batch.forward(model), low)
    homogeneous = max(moved)
    notes = []
    if tol.RELU.violated(homogeneous):
        notes.append(
            f"W1, b1 times {RESCALE:g} or 1/{RESCALE:g} (W2 the inverse) move the logits by {homogeneous:.3g}: the "
            "activation is not positively homogeneous (GELU, SiLU?)"
        )
    if tol.RELU.violated(dead):
        notes.append(
            f"b1 lowered below every pre-activation, then twice as far, moves the logits by {dead:.3g}: the "
            "activation is not 0 below 0 (a leaky ReLU?)"
        )
    return max(homogeneous, dead), "; ".join(notes)
