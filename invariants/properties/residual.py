"""Residual connections and layer normalisation (section 3.1): "the output of each sub-layer is
LayerNorm(x + Sublayer(x))"; where dropout goes is in dropout.py.

With every weight matrix of the encoder's and decoder's sub-layers set to zero, a sub-layer computes a constant
(its biases), so each layer is LayerNorm(x + constant): the input still reaches the output along the residual
path, and different tokens stay different. A stack that drops one residual connection computes
LayerNorm(constant) there instead, the same vector at every position, and everything after it is the same too.
The weight matrices are the 2-D trainable parameters that parameter_groups() files under "encoder" and "decoder",
less the embedding and pre-softmax matrices; the check zeroes a fresh copy, never the subject's cached model.

On the same zeroed copy, each layer is LayerNorm(x + constant): as the input embeddings grow, the constants
vanish beside them and LayerNorm divides the scale away, so the outputs converge. A stack that leaves out its
LayerNorm computes x + constants, and its outputs grow with the input.

`post_ln_order`: the order within each block, LayerNorm(x + Sublayer(x)) (section 3.1), and not the pre-LN
order x + Sublayer(LayerNorm(x)) of later models.

A pre-LN stack that ends in a LayerNorm normalises what leaves it too, so layer_norm_outputs cannot tell the two
apart. What differs is the residual stream. After every post-LN sub-layer the stream is back at unit size, so from the
first sub-layer on each sub-layer's output counts as much as the stream it is added to, whatever the size of the input
embeddings. A pre-LN stack never normalises its stream: its sub-layers read a normalised copy and add outputs of unit
size to it. Multiply the input embeddings by 1e6: in a post-LN stack the other source positions still move an encoder
output, and the source still moves the logits (through cross-attention), by about as much as at unit size; in a pre-LN
stack the input dominates the stream and they move it 1e6 times less. Measured as the ratio of the two influences,
for the encoder (the other half of the source positions redrawn) and the decoder (every source token redrawn, target
embeddings scaled).

A stack that normalises its embeddings first (BART) sees inputs of unit size at any scale: post-LN, it passes; a
pre-LN stack with such a LayerNorm would pass as well (mBART's order), which this check cannot see.

`residual_own_input`: the cross-attention sub-layer computes LayerNorm(x + CrossAttention(x, memory)) where x is its own
input, the self-attention sub-layer's output. A residual that adds the layer's input instead (the block's first x)
drops what self-attention computed whenever cross-attention does not carry it on. With a one-token source it cannot:
attention over one key returns that key's value to every query, the same vector whatever the query. Then each target
position's logits depend only on its own token, unless the residual carries the self-attention's mixing of earlier
target positions, as the paper's does.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.groups import RESIDUAL
from invariants.measure import other_tokens, relative_change, without_sublayer_weights
from invariants.subject import OWN_CONFIG, Overrides, Subject, distinctness, tokens
from model.protocol import Seq2SeqModel

TOKENS = 8  # distinct tokens in the probe sequence (fewer when the vocabulary is smaller)
SCALES = (1e6, 1e10)  # input embedding sizes: constants of O(1) move a normalised output by ~1/scale


@invariant(
    RESIDUAL,
    tol.RESIDUAL,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
)
def residual_paths(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With the sub-layers' weight matrices zeroed, distinct tokens still give distinct encoder outputs and logits: each sub-layer's input reaches its output (paper, section 3.1)."""
    config, seed = case
    model = without_sublayer_weights(subject, config)
    if model.config.d_model <= 2:
        raise NotApplicable(
            "d_model <= 2: LayerNorm maps every vector to one of two points, so tokens cannot stay apart"
        )
    n = min(TOKENS, model.config.vocab_size - 1)
    ids = tokens(model.config, (1, n), torch.Generator().manual_seed(seed), distinct=True)
    pad = torch.zeros_like(ids, dtype=torch.bool)
    with torch.no_grad():
        memory = model.encode(ids, pad)
        logits = model.decode(ids, memory, pad, pad)
    encoder, decoder = distinctness(memory[0]), distinctness(logits[0])
    lost = [
        name for name, d in (("encoder outputs", encoder), ("decoder logits", decoder)) if not d >= tol.RESIDUAL.value
    ]
    return min(encoder, decoder), (
        f"{' and '.join(lost)} are the same at every position: a residual path is missing" if lost else ""
    )


@invariant(
    RESIDUAL,
    tol.NORMALISED,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
)
def layer_norm_outputs(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With the sub-layers' weight matrices zeroed, input embeddings of size 1e6 and 1e10 give the same encoder outputs and logits: each layer ends in LayerNorm (paper, section 3.1)."""
    config, seed = case
    model = without_sublayer_weights(subject, config)
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    source, target = torch.randn(2, 1, TOKENS, cfg.d_model, generator=gen, dtype=torch.float64)
    pad = torch.zeros(1, TOKENS, dtype=torch.bool)
    memories, logits = [], []
    with torch.no_grad():
        for scale in SCALES:
            memories.append(model.encode(scale * source, pad))
            logits.append(model.decode(scale * target, memories[-1], pad, pad))
    encoder, decoder = relative_change(*memories, memories[-1]), relative_change(*logits, logits[-1])
    grown = [
        name
        for name, change in (("encoder outputs", encoder), ("decoder logits", decoder))
        if not change <= tol.NORMALISED.value
    ]
    return max(encoder, decoder), (
        f"{' and '.join(grown)} grow with the input: no LayerNorm after the residual sum" if grown else ""
    )


LARGE = (
    1e6  # the input embeddings' scale: a pre-LN stack's influences shrink by this factor, float64 keeps 1e-10 of them
)
ROWS, SOURCE_LEN, TARGET_LEN = 4, 6, 4


def influence(before: Tensor, after: Tensor) -> float:
    """The largest change at the positions compared, relative to the largest output there."""
    return relative_change(before, after, before)


def encoder_influences(model: Seq2SeqModel, gen: torch.Generator) -> tuple[float, float]:
    """How much redrawing the second half of the source embeddings moves the encoder outputs of the first half, at
    unit scale and at LARGE."""
    S, d = min(SOURCE_LEN, model.config.max_len), model.config.d_model
    kept = (S + 1) // 2
    x = torch.randn(ROWS, S, d, generator=gen, dtype=torch.float64)
    other = torch.cat([x[:, :kept], torch.randn(ROWS, S - kept, d, generator=gen, dtype=torch.float64)], 1)
    pad = torch.zeros(ROWS, S, dtype=torch.bool)
    return tuple(
        influence(model.encode(scale * x, pad)[:, :kept], model.encode(scale * other, pad)[:, :kept])
        for scale in (1.0, LARGE)
    )


def decoder_influences(model: Seq2SeqModel, gen: torch.Generator) -> tuple[float, float]:
    """How much redrawing every source token moves the logits, with the target embeddings at unit scale and at LARGE."""
    cfg = model.config
    S, T = min(SOURCE_LEN, cfg.max_len), min(TARGET_LEN, cfg.max_len)
    src = tokens(cfg, (ROWS, S), gen)
    src_pad, tgt_pad = torch.zeros(ROWS, S, dtype=torch.bool), torch.zeros(ROWS, T, dtype=torch.bool)
    memories = [model.encode(ids, src_pad) for ids in (src, other_tokens(src, cfg.pad_id, cfg.vocab_size, gen))]
    y = torch.randn(ROWS, T, cfg.d_model, generator=gen, dtype=torch.float64)
    return tuple(
        influence(*(model.decode(scale * y, memory, src_pad, tgt_pad) for memory in memories)) for scale in (1.0, LARGE)
    )


@invariant(
    RESIDUAL,
    tol.POST_LN,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
)
def post_ln_order(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With input embeddings 1e6 times their size, other positions still move an encoder output and the source still moves the logits about as much as at unit size: each sub-layer's output is LayerNorm(x + Sublayer(x)), not x + Sublayer(LayerNorm(x)) (paper, section 3.1)."""
    config, seed = case
    model = subject.model(config).eval()
    gen = torch.Generator().manual_seed(seed)
    measured = {
        "other source positions on an encoder output": encoder_influences(model, gen),
        "the source on the logits": decoder_influences(model, gen),
    }
    judged = {what: large / unit for what, (unit, large) in measured.items() if unit > 0}
    notes = [
        f"{what}: {large:.3g} at 1e6 x the input size, {unit:.3g} at unit size"
        for what, (unit, large) in measured.items()
        if what in judged and tol.POST_LN.violated(judged[what])
    ]
    if notes:
        notes.append("a stream that is not normalised after each residual sum (pre-LN) lets the input drown them")
    notes += [
        f"{what}: no influence even at unit size, nothing to judge here" for what in measured if what not in judged
    ]
    if not judged:
        raise NotApplicable("neither other source positions nor the source move any output, even at unit size")
    return min(judged.values()), "; ".join(notes)


OWN_INPUT_ROWS = 3  # residual_own_input's batch rows


@invariant(
    RESIDUAL,
    tol.RESIDUAL_SOURCE,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
)
def residual_own_input(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With a one-token source (cross-attention then returns one vector to every query), changing the target tokens before the last moves its logits: the cross-attention residual adds its own input, which carries self-attention's output (paper, section 3.1)."""
    config, seed = case
    model = subject.model(config).eval()
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    T = min(6, cfg.max_len)
    source = tokens(cfg, (OWN_INPUT_ROWS, 1), gen)
    target = tokens(cfg, (OWN_INPUT_ROWS, T), gen)
    earlier_changed = torch.cat([other_tokens(target[:, :-1], cfg.pad_id, cfg.vocab_size, gen), target[:, -1:]], 1)
    targets = [target, earlier_changed]  # the last position's own token stays, every earlier one changes
    src_pad, tgt_pad = (
        torch.zeros(OWN_INPUT_ROWS, 1, dtype=torch.bool),
        torch.zeros(OWN_INPUT_ROWS, T, dtype=torch.bool),
    )
    last = [model(source, tgt, src_pad, tgt_pad)[:, -1] for tgt in targets]
    change = min(relative_change(last[0][b], last[1][b], last[0][b]) for b in range(OWN_INPUT_ROWS))
    return change, (
        ""
        if change >= tol.RESIDUAL_SOURCE.value
        else "the last position's logits depend on its own token only: the residual around cross-attention adds "
        "the decoder layer's input, not the self-attention sub-layer's output"
    )
