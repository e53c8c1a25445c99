"""Without positional encoding the encoder is permutation-equivariant and cross-attention order-blind.

The positive control shows the check has teeth: with the encoding on, permuting the source moves the
encoder outputs measurably. Sources are drawn with distinct tokens per row, so that a permutation
always changes the sequence.
"""

from __future__ import annotations

import torch

from invariants import tolerances as tol
from invariants.cases import Case, batch_cases, pinned_cases
from invariants.engine import invariant
from invariants.groups import PERMUTATION
from invariants.subject import Subject, relative_error
from model.batch import Batch


def permuted(case: Case, batch: Batch, within_tokens: bool) -> tuple[torch.Tensor, Batch]:
    """A random non-identity permutation of the source positions (when S > 1), (B, S) row by row, and the batch with
    it applied. With within_tokens (a model that supports one padding side) each row's tokens change places among
    themselves and its padding stays where it is; else the padding moves too, into the middle of a row."""
    gen = torch.Generator().manual_seed(case.seed)
    perm = torch.randperm(case.src_len, generator=gen)
    if case.src_len > 1 and torch.equal(perm, torch.arange(case.src_len)):
        perm = perm.roll(1)
    rows = perm.expand(batch.src.size(0), -1).clone()
    if within_tokens:
        for row, pad in zip(rows, batch.src_pad):
            real = (~pad).nonzero().squeeze(1)
            order = torch.randperm(real.numel(), generator=gen)
            if real.numel() > 1 and torch.equal(order, torch.arange(real.numel())):
                order = order.roll(1)
            row.copy_(torch.arange(case.src_len))
            row[real] = real[order]
    take = lambda x: x.gather(1, rows)  # noqa: E731
    return rows, Batch(take(batch.src), batch.tgt, take(batch.src_pad), batch.tgt_pad)


def encoder_deviation(subject: Subject, case: Case) -> float:
    """|encode(permuted source) - permuted encode(source)| at non-pad positions, relative, in eval mode.

    Outputs at pad positions are left out: nothing reads them (cross-attention masks them), and torch's
    nested-tensor fast path zeroes them only when the padding is a suffix.
    """
    model, batch = subject.model(case.config), case.make_batch(subject, distinct=True)
    rows, other = permuted(case, batch, len(subject.padding_sides) == 1)
    model.eval()
    keep = ~other.src_pad
    encoded = model.encode(batch.src, batch.src_pad)
    moved = encoded.gather(1, rows[..., None].expand(-1, -1, encoded.size(-1)))
    return relative_error(model.encode(other.src, other.src_pad)[keep], moved[keep])


def without_pe_cases(subject: Subject):
    return batch_cases(subject, train=False, capture=False)


def pinned(subject: Subject) -> list[Case]:
    return pinned_cases(subject, train=(False,), capture=(False,), src_len=6)


@invariant(
    PERMUTATION, tol.AGREEMENT[torch.float64], pinned=pinned, cases=without_pe_cases, needs=("positional_switch",)
)
def permutation_encoder(subject: Subject, case: Case) -> float:
    """With positional encoding off, permuting the source tokens permutes the encoder outputs the same way (paper, sections 3.2 and 3.5)."""
    with subject.model(case.config).positional_encoding(False):
        return encoder_deviation(subject, case)


@invariant(
    PERMUTATION, tol.AGREEMENT[torch.float64], pinned=pinned, cases=without_pe_cases, needs=("positional_switch",)
)
def permutation_cross_attention(subject: Subject, case: Case) -> float:
    """With positional encoding off, permuting the source leaves the decoder's logits unchanged (paper, sections 3.2.3 and 3.5)."""
    model, batch = subject.model(case.config), case.make_batch(subject, distinct=True)
    _, other = permuted(case, batch, len(subject.padding_sides) == 1)
    model.eval()
    with model.positional_encoding(False):
        return relative_error(other.forward(model), batch.forward(model))


@invariant(
    PERMUTATION,
    tol.EFFECT,
    pinned=lambda s: [c for c in pinned(s) if not c.padded],
    cases=lambda s: batch_cases(s, train=False, capture=False, padded=False, min_src=2),
    needs=("positional_table",),
)
def permutation_positive_control(subject: Subject, case: Case) -> float:
    """With positional encoding on, permuting the source breaks encoder equivariance measurably (paper, section 3.5: PE injects order)."""
    return encoder_deviation(subject, case)
