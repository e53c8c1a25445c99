"""Captured attention rows are probability distributions, padded keys get exactly 0, and a batch row
with nothing to attend to (fully padded) keeps what a user observes finite.

Only rows of non-pad queries are judged: the outputs at padded query positions are read by nothing (the loss
skips them, cross-attention masks them), so a model may leave them as it likes. A query with no visible key (a
"dead row") has no right answer in the paper; whether a model makes it all zeros (the reference) or uniform over
the masked keys (HuggingFace) is its convention, reported but not judged.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import Case, batch_cases, pinned_cases
from invariants.engine import invariant
from invariants.groups import SOFTMAX
from invariants.measure import misshapen, place, worst_row
from invariants.subject import Subject, seeded
from model.batch import Batch
from model.protocol import Seq2SeqModel

EXTREME = 1e4  # decoder inputs scaled to norm ~1e4 * sqrt(d_model): scores overflow a naive float32 softmax


def allowed_keys(kind: str, batch: Batch) -> Tensor:
    """(B, 1, T_q, T_k) bool: the keys a query of this attention kind may see (causal and non-pad)."""
    if kind == "decoder_self":
        T = batch.tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return causal & ~batch.tgt_pad[:, None, None, :]
    S, T_q = batch.src.size(1), (batch.src if kind == "encoder_self" else batch.tgt).size(1)
    return (~batch.src_pad[:, None, None, :]).expand(-1, 1, T_q, S)


def query_rows(kind: str, batch: Batch) -> Tensor:
    """(B, 1, T_q, 1) bool: the non-pad queries of this attention kind (target positions for decoder and cross)."""
    pad = batch.src_pad if kind == "encoder_self" else batch.tgt_pad
    return ~pad[:, None, :, None]


# What a row with nothing to attend to in a one-position sequence breaks besides the softmax properties.
CONSEQUENCES = "dropout_sites, whose one-position sequences then get no sub-layer output from that attention"


def dead_row_hint(record, b: int, query: int, visible: int) -> str:
    """Why a row that sums to 0 matters: it sees no key though the paper leaves it `visible`, and what else that breaks."""
    mask = (
        " (its own position among them: does the causal mask hide the diagonal, keys < i instead of keys <= i?)"
        if record.kind == "decoder_self"
        else ""
    )
    return (
        f"the row is all zeros: the model lets this query see no key, though the paper's masks leave it {visible}{mask}; "
        f"other properties that fail as a consequence: {CONSEQUENCES}"
    )


def describe_scaled(case_scale: tuple[Case, float]) -> str:
    """softmax_rows' case in words: the batch, and the factor on the decoder's input embeddings."""
    case, scale = case_scale
    return f"{case!r} with the decoder's input embeddings times {scale:g}"


def captured(model: Seq2SeqModel, batch: Batch, case: Case, scale: float = 1.0, source_scale: float = 1.0) -> list:
    """Attention records of one forward pass; the decoder input embeddings are multiplied by scale, and the source's
    (fed as embeddings, embed() of its ids) by source_scale where that is not 1."""
    model.train(case.train)
    with seeded(case.seed), model.attention_probs() as records:
        source = batch.src if source_scale == 1.0 else model.embed(batch.src) * source_scale
        memory = model.encode(source, batch.src_pad)
        model.decode(model.embed(batch.tgt) * scale, memory, batch.src_pad, batch.tgt_pad)
    if not records:
        raise ValueError("attention_probs() captured no attention records")
    return records


@invariant(
    SOFTMAX,
    tol.ROW_SUM[torch.float32],
    pinned=lambda s: list(zip(pinned_cases(s, train=(False,), capture=(True,)), (1.0, EXTREME))),
    cases=lambda s: st.tuples(batch_cases(s, train=False, capture=True), st.sampled_from([1.0, EXTREME])),
    needs=("attention_probs", "target_embeddings"),
    describe=describe_scaled,
)
def softmax_rows(subject: Subject, case_scale: tuple[Case, float]) -> float | tuple[float, str]:
    """Every captured row of a non-pad query with a visible key sums to 1, entries in [0, 1], finite, also at extreme inputs (float32, eval) (paper, section 3.2.1).

    Eval mode: torch.nn.MultiheadAttention applies dropout to the probabilities it returns in train mode (the
    paper has no attention dropout), so in training its rows legitimately do not sum to 1.
    """
    case, scale = case_scale
    model, batch = subject.model(case.config, torch.float32), case.make_batch(subject)
    records = captured(model, batch, case, scale)
    wrong = misshapen(records, batch)
    if wrong:
        return float("inf"), wrong
    worst, where = 0.0, ""
    for record in records:
        p = record.probs.double()
        allowed = allowed_keys(record.kind, batch)
        judged = (allowed.any(-1, keepdim=True) & query_rows(record.kind, batch)).expand_as(p)
        rows = p.masked_fill(~judged, 0.0)
        if not torch.isfinite(rows).all():
            b, head, query = (~torch.isfinite(rows).all(-1)).nonzero()[0].tolist()
            return float("inf"), f"a non-finite probability in {place(record, b, head, query)}"
        sums = rows.sum(-1)
        per_row = torch.maximum((sums - 1).abs() * judged[..., 0], torch.maximum(-rows.amin(-1), rows.amax(-1) - 1))
        error, (b, head, query) = worst_row(per_row)
        if error > worst:
            worst = error
            where = f"worst row: {place(record, b, head, query)}, which sums to {sums[b, head, query].item():.6g}"
            if abs(sums[b, head, query].item()) < 1e-6:
                where += "; " + dead_row_hint(record, b, query, int(allowed[b, 0, query].sum()))
    return (worst, where) if tol.ROW_SUM[torch.float32].violated(worst) else worst


def describe_loud(case_scale: tuple[Case, float]) -> str:
    """padding_probs_zero's case in words: the batch, and the factor on the input embeddings."""
    case, scale = case_scale
    return f"{case!r} with the input embeddings times {scale:g}" if scale != 1.0 else repr(case)


@invariant(
    SOFTMAX,
    tol.EXACT,
    pinned=lambda s: list(zip(pinned_cases(s, capture=(True,), padded=(True,)), (1.0, EXTREME))),
    cases=lambda s: st.tuples(batch_cases(s, capture=True, padded=True), st.sampled_from([1.0, EXTREME])),
    needs=("attention_probs", "target_embeddings"),
    describe=describe_loud,
)
def padding_probs_zero(subject: Subject, case_scale: tuple[Case, float]) -> float | tuple[float, str]:
    """Every non-pad query puts exactly 0 probability on padded keys, in encoder, decoder and cross-attention, also where scores reach 1e8 (paper, section 3.2.3: masking).

    Rows of padded queries are free (nothing reads them); rows with no visible key are fully_padded_rows' matter.
    Input embeddings times EXTREME (the source's too, where the model takes source embeddings) make the first layer's
    scores ~1e8: a mask that subtracts a finite constant (-1e4, as float16 code does) then leaves weight on a
    padded key, which the dtype's lowest value or -inf never does.
    """
    case, scale = case_scale
    model, batch = subject.model(case.config), case.make_batch(subject)
    source_scale = scale if scale != 1.0 and not subject.lacks("source_embeddings") else 1.0
    records = captured(model, batch, case, scale, source_scale)
    wrong = misshapen(records, batch)
    if wrong:
        return float("inf"), wrong
    worst, where = 0.0, ""
    for record in records:
        pad_keys = (batch.tgt_pad if record.kind == "decoder_self" else batch.src_pad)[:, None, None, :]
        judged = pad_keys & query_rows(record.kind, batch) & allowed_keys(record.kind, batch).any(-1, keepdim=True)
        masked = record.probs.masked_fill(~judged, 0.0).double()
        per_row = masked.abs().nan_to_num(float("inf"), float("inf"), float("inf")).amax(-1)
        error, (b, head, query) = worst_row(per_row) if per_row.numel() else (0.0, (0, 0, 0))
        if error > worst:
            key = int(masked[b, head, query].abs().nan_to_num(float("inf")).argmax())
            worst, where = error, f"worst: {place(record, b, head, query)} puts {error:.3g} on padded key {key}"
    return (worst, where) if worst > 0 else worst


FULLY_PADDED = ("source", "target", "both")


def dead_row_convention(records: list, batch: Batch) -> str:
    """What the model does with rows that have no visible key: all zeros, uniform, or something else (counted)."""
    zeros = uniform = other = 0
    wrong = misshapen(records, batch)
    if wrong:
        return wrong
    for record in records:
        dead = ~allowed_keys(record.kind, batch).any(-1)  # (B, 1, T_q)
        rows = record.probs.detach().double()[dead.expand(record.probs.shape[:-1])]
        if rows.numel():
            is_zero = rows.abs().amax(-1) == 0
            is_uniform = (rows - 1.0 / rows.size(-1)).abs().amax(-1) < 1e-6
            zeros, uniform = zeros + int(is_zero.sum()), uniform + int(is_uniform.sum())
            other += int((~is_zero & ~is_uniform).sum())
    counts = [f"{n} {what}" for n, what in ((zeros, "all zero"), (uniform, "uniform"), (other, "other")) if n]
    return (
        f"rows with no visible key: {', '.join(counts)} (the model's convention, reported, not judged)"
        if counts
        else ""
    )


@invariant(
    SOFTMAX,
    tol.COUNT,
    pinned=lambda s: list(zip(pinned_cases(s, padded=(False,))[::-1], ("both", "target"))),
    cases=lambda s: st.tuples(batch_cases(s, padded=False), st.sampled_from(FULLY_PADDED)),
)
def fully_padded_rows(subject: Subject, case_which: tuple[Case, str]) -> tuple[float, str]:
    """A fully padded source or target row keeps the loss, the logits at non-pad positions and every gradient finite (user-observable).

    Counted: non-finite logits at non-pad target positions, a non-finite loss, parameters with non-finite gradients;
    with and without attention probabilities requested (the two paths can differ: torch.nn's do). What the attention
    rows with no visible key hold is reported as the model's convention, not judged.
    """
    case, which = case_which
    model = subject.model(case.config, torch.float32)  # float32, where a -inf mask turns into NaN
    batch = Case(case.config, 2, case.src_len, case.tgt_len, False, case.train, case.capture, case.seed).make_batch(
        subject
    )
    src_pad, tgt_pad = batch.src_pad.clone(), batch.tgt_pad.clone()
    if which in ("source", "both"):
        src_pad[1] = True
    if which in ("target", "both"):
        tgt_pad[1] = True
    pad_id = model.config.pad_id
    batch = Batch(batch.src.masked_fill(src_pad, pad_id), batch.tgt.masked_fill(tgt_pad, pad_id), src_pad, tgt_pad)
    model.train(case.train)
    with torch.enable_grad():
        with seeded(case.seed), model.attention_probs() if case.capture else nullcontext([]) as records:
            logits = batch.forward(model)
        loss = model.loss(logits, batch.tgt)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    bad_logits = int((~torch.isfinite(logits[~tgt_pad])).sum())
    bad_loss = int(not torch.isfinite(loss))
    bad_grads = sum(1 for g in grads if g is not None and not torch.isfinite(g).all())
    error = bad_logits + bad_loss + bad_grads
    mode = ("train" if case.train else "eval") + (", attention probabilities requested" if case.capture else "")
    found = (
        f"{which} row fully padded ({mode}): {bad_logits} non-finite logits at non-pad positions, "
        f"{'a non-finite' if bad_loss else 'a finite'} loss, {bad_grads} parameters with non-finite gradients"
    )
    return error, found if error else dead_row_convention(records, batch)
