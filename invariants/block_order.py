"""Invariant 7, continued: the order within each block, LayerNorm(x + Sublayer(x)) (section 3.1), and not the pre-LN
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
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.behaviour import relative_change
from invariants.cases import small_configs
from invariants.cross_attention import other_tokens
from invariants.engine import NotApplicable, invariant
from invariants.residual import GROUP
from invariants.subject import OWN_CONFIG, Overrides, Subject, tokens
from model.protocol import Seq2SeqModel

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
    GROUP,
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
