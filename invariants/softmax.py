"""Invariant 3: captured attention rows are probability distributions, masked entries are exactly 0,
and a query with nothing to attend to (a fully padded row) stays finite.

The defined behaviour for a fully padded row (the reference's, documented in model/attention.py):
its probabilities are all 0, its attention output is 0, and forward and backward stay finite.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import Case, batch_cases, pinned_cases
from invariants.engine import invariant
from invariants.subject import Batch, Subject, seeded

GROUP = "3 softmax rows"
EXTREME = 1e4  # decoder inputs scaled to norm ~1e4 * sqrt(d_model): scores overflow a naive float32 softmax


def allowed_keys(kind: str, batch: Batch) -> Tensor:
    """(B, 1, T_q, T_k) bool: the keys a query of this attention kind may see (causal and non-pad)."""
    if kind == "decoder_self":
        T = batch.tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return causal & ~batch.tgt_pad[:, None, None, :]
    S, T_q = batch.src.size(1), (batch.src if kind == "encoder_self" else batch.tgt).size(1)
    return (~batch.src_pad[:, None, None, :]).expand(-1, 1, T_q, S)


def captured(model, batch: Batch, case: Case, scale: float = 1.0) -> list:
    """Attention records of one forward pass; the decoder input embeddings are multiplied by scale."""
    model.train(case.train)
    with seeded(case.seed), model.attention_probs() as records:
        memory = model.encode(batch.src, batch.src_pad)
        model.decode(model.embed(batch.tgt) * scale, memory, batch.src_pad, batch.tgt_pad)
    if not records:
        raise ValueError("attention_probs() captured no attention records")
    return records


@invariant(GROUP, tol.ROW_SUM[torch.float32],
           pinned=lambda s: list(zip(pinned_cases(s, train=(False,), capture=(True,)), (1.0, EXTREME))),
           cases=lambda s: st.tuples(batch_cases(s, train=False, capture=True), st.sampled_from([1.0, EXTREME])),
           needs=("attention_probs",))
def softmax_rows(subject: Subject, case_scale: tuple[Case, float]) -> float:
    """Every captured attention row with a visible key sums to 1 with entries in [0, 1], finite, also at extreme inputs (float32, eval).

    Eval mode: torch.nn.MultiheadAttention applies dropout to the probabilities it returns in train mode (the
    paper has no attention dropout), so in training its rows legitimately do not sum to 1.
    """
    case, scale = case_scale
    model, batch = subject.model(case.config, torch.float32), case.make_batch(subject)
    worst = 0.0
    for record in captured(model, batch, case, scale):
        p = record.probs.double()
        if not torch.isfinite(p).all():
            return float("inf")
        has_key = allowed_keys(record.kind, batch).any(-1).expand(p.shape[:-1])
        worst = max(worst, (p.sum(-1) - 1)[has_key].abs().max().item(), -p.min().item(), p.max().item() - 1)
    return worst


@invariant(GROUP, tol.EXACT, pinned=lambda s: pinned_cases(s, capture=(True,), padded=(True,)),
           cases=lambda s: batch_cases(s, capture=True, padded=True), needs=("attention_probs",))
def padding_probs_zero(subject: Subject, case: Case) -> float:
    """Captured attention probabilities on padded keys (encoder, decoder and cross-attention) are exactly 0."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    worst = 0.0
    for record in captured(model, batch, case):
        pad_keys = (batch.tgt_pad if record.kind == "decoder_self" else batch.src_pad)[:, None, None, :]
        masked = record.probs.masked_fill(~pad_keys, 0.0)
        worst = max(worst, masked.abs().max().item() if torch.isfinite(masked).all() else float("inf"))
    return worst


FULLY_PADDED = ("source", "target", "both")


@invariant(GROUP, tol.COUNT,
           pinned=lambda s: list(zip(pinned_cases(s, padded=(False,)), ("both", "target"))),
           cases=lambda s: st.tuples(batch_cases(s, padded=False), st.sampled_from(FULLY_PADDED)))
def fully_padded_rows(subject: Subject, case_which: tuple[Case, str]) -> tuple[float, str]:
    """A fully padded source or target row keeps logits and gradients finite, and (if captured) its attention rows are all 0.

    Measured as the number of non-finite logits and gradient tensors, plus the largest probability on a row with no key,
    with and without attention probabilities requested (the two paths can differ: torch.nn's does).
    """
    case, which = case_which
    model = subject.model(case.config, torch.float32)  # float32, where a -inf mask turns into NaN
    batch = Case(case.config, 2, case.src_len, case.tgt_len, False, case.train, case.capture, case.seed).make_batch(subject)
    src_pad, tgt_pad = batch.src_pad.clone(), batch.tgt_pad.clone()
    if which in ("source", "both"):
        src_pad[1] = True
    if which in ("target", "both"):
        tgt_pad[1] = True
    pad_id = model.config.pad_id
    batch = Batch(batch.src.masked_fill(src_pad, pad_id), batch.tgt.masked_fill(tgt_pad, pad_id), src_pad, tgt_pad)
    model.train(case.train)
    with torch.enable_grad():
        with seeded(case.seed), (model.attention_probs() if case.capture else nullcontext([])) as records:
            logits = batch.forward(model)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(model.loss(logits, batch.tgt), params, allow_unused=True)
    bad_logits = int((~torch.isfinite(logits)).sum())
    bad_grads = sum(1 for g in grads if g is not None and not torch.isfinite(g).all())
    empty_row_probs = 0.0
    for record in records:
        empty = ~allowed_keys(record.kind, batch).any(-1, keepdim=True)  # (B, 1, T_q, 1)
        values = record.probs.detach().masked_fill(~empty, 0.0)
        empty_row_probs = max(empty_row_probs, values.abs().max().item() if torch.isfinite(values).all() else float("inf"))
    error = bad_logits + bad_grads + empty_row_probs
    mode = ("train" if case.train else "eval") + (", attention probabilities requested" if case.capture else "")
    probs = f"{empty_row_probs:g}" if math.isfinite(empty_row_probs) else "NaN or Inf"
    return error, (f"{which} row fully padded ({mode}): {bad_logits} non-finite logits, {bad_grads} parameters with "
                   f"non-finite gradients, largest |probability| on a row with no key {probs}") if error else ""
