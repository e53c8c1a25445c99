"""Attention as the records show it: each head's probabilities are a softmax of its scaled dot products over the keys
it may see (section 3.2.1), query heads of a group read one key head (GQA), and a window hides exactly the keys
outside it."""

from __future__ import annotations

import torch
from torch import Tensor

from invariants import tolerances as tol
from invariants.guard import Skipped
from invariants.lm.cases import LMCase, lm_cases, pinned_lm_cases
from invariants.lm.groups import ATTENTION
from invariants.lm.measure import recorded, visible, worst_index
from invariants.lm.properties import lm_invariant
from invariants.lm.subject import LMSubject
from invariants.subject import relative_error
from model.lm.protocol import LMAttentionRecord

AGREEMENT = tol.AGREEMENT[torch.float64]


def real_queries(record: LMAttentionRecord, pad: Tensor) -> Tensor:
    """(B, 1, T_q, 1) bool: the record's queries that are real tokens."""
    return ~pad[:, -record.probs.size(2) :, None][:, None]


@lm_invariant(
    ATTENTION,
    tol.LM_ROW_SUM,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s),
    needs=("attention_records",),
)
def softmax_rows(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Every real query's attention probabilities are non-negative and sum to 1, in every layer and head (section 3.2.1)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    worst, where = 0.0, ""
    for r in recorded(model, ids, pad):
        real = real_queries(r, pad).expand_as(r.probs[..., :1]).squeeze(-1)  # (B, h, T_q)
        sums = (r.probs.sum(-1) - 1).abs().masked_fill(~real, 0)
        negative = (-r.probs).clamp(min=0).amax(-1).masked_fill(~real, 0)
        error = torch.maximum(sums, negative)
        if not torch.isfinite(r.probs.masked_fill(~real[..., None], 0)).all():
            return float("inf"), f"layer {r.layer}: non-finite probabilities at a real query"
        if error.max().item() > worst:
            b, head, query = worst_index(error)
            worst, where = error.max().item(), f"layer {r.layer}, row {b}, head {head}, query {query}"
    return worst, where


@lm_invariant(
    ATTENTION,
    tol.EXACT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s),
    needs=("attention_records",),
)
def hidden_keys_zero(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Every real query gives exactly 0 to later keys, padding keys and keys outside its window, in every layer and head (section 3.2.3)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    hidden = ~visible(pad, model.config)[:, None]  # (B, 1, T, T)
    worst, where = 0.0, ""
    for r in recorded(model, ids, pad):
        leak = r.probs.abs().masked_fill(~(hidden & real_queries(r, pad)), 0)
        if leak.max().item() > worst or leak.max().item() != leak.max().item():
            b, head, query, key = worst_index(leak)
            worst = leak.max().item()
            where = f"layer {r.layer}, row {b}, head {head}: query {query} gives the hidden key {key} {worst:.3g}"
    return worst, where


def expected_probs(r: LMAttentionRecord, pad: Tensor, cfg, scale: float, grouping: str = "interleaved") -> Tensor:
    """softmax(q k^T * scale) over the visible keys, query head i reading key head i // group ('interleaved', GQA's
    grouping) or i % kv_heads ('tiled')."""
    group = r.q.size(1) // r.k.size(1)
    k = r.k.repeat_interleave(group, 1) if grouping == "interleaved" else r.k.repeat(1, group, 1, 1)
    scores = (r.q @ k.transpose(-2, -1)) * scale
    seen = visible(pad, cfg)[:, None]
    return torch.softmax(scores.masked_fill(~seen, float("-inf")), -1).nan_to_num(0.0)


@lm_invariant(
    ATTENTION,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s),
    needs=("attention_records",),
)
def attention_scores(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Each head's probabilities are softmax(q k^T / sqrt(d_head)) over its visible keys, query head i reading key/value head i // (n_heads / n_kv_heads) (sections 3.2.1, 3.2.2; GQA)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    cfg = model.config
    worst, where = 0.0, ""
    for r in recorded(model, ids, pad):
        real = real_queries(r, pad)
        error = relative_error(r.probs * real, expected_probs(r, pad, cfg, r.q.size(-1) ** -0.5) * real)
        if error > worst or error != error:
            worst, where = error, f"layer {r.layer}" + (f": {diagnosis(r, pad, cfg, real)}" if error > FITS else "")
    return worst, where


FITS = 1e-6  # a recomputation this close to the records fits them (float32 noise is ~1e-7, a departure >= 1e-3)


def diagnosis(r: LMAttentionRecord, pad: Tensor, cfg, real: Tensor) -> str:
    """Which departure fits the recorded probabilities: another scale, or key heads tiled instead of grouped."""
    d = r.q.size(-1)
    for what, scale, grouping in (
        ("the scale is 1/d_head instead of 1/sqrt(d_head)", 1 / d, "interleaved"),
        ("there is no 1/sqrt(d_head) scale", 1.0, "interleaved"),
        ("the scale is 1/sqrt(d_model) instead of 1/sqrt(d_head)", cfg.d_model**-0.5, "interleaved"),
        ("query head i reads key head i % n_kv_heads (repeated, not grouped)", d**-0.5, "tiled"),
    ):
        if relative_error(r.probs * real, expected_probs(r, pad, cfg, scale, grouping) * real) < FITS:
            return f"the probabilities fit when {what}"
    return "no simple departure (scale, grouping) fits the recorded probabilities"


@lm_invariant(
    ATTENTION,
    tol.EXACT,
    pinned=lambda s: [c for c in pinned_lm_cases(s) if not c.padded],
    cases=lambda s: lm_cases(s, min_length=3),
    needs=("attention_records",),
    applicable=lambda s: None if s.config.window else "the model has no sliding window (config window=0)",
)
def sliding_window(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """The key just outside a query's window gets probability exactly 0 and the key just inside one above 0, in every layer and head (Mistral's sliding window: query i sees keys i - window < j <= i)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    w = model.config.window
    if w >= case.length:
        raise Skipped(f"window {w}", f"it covers all {case.length} positions: nothing is outside it")
    for r in recorded(model, ids, pad):
        queries = torch.arange(w, case.length)
        outside, inside = r.probs[..., queries, queries - w], r.probs[..., queries, queries - w + 1]
        real = ~pad[:, queries] & ~pad[:, queries - w] & ~pad[:, queries - w + 1]
        outside, inside = outside.masked_fill(~real[:, None], 0), inside.masked_fill(~real[:, None], 1)
        if outside.abs().max() > 0:
            b, head, q = worst_index(outside.abs())
            return outside.abs().max().item(), (
                f"layer {r.layer}, row {b}, head {head}: query {int(queries[q])} gives the key {w} back, outside its "
                f"window of {w}, {outside.abs().max().item():.3g}: the window is a key too long"
            )
        if (inside == 0).any():
            b, head, q = worst_index((inside == 0).double())
            return 1.0, (
                f"layer {r.layer}, row {b}, head {head}: query {int(queries[q])} gives the key {w - 1} back, inside "
                f"its window of {w}, exactly 0: the window is a key too short"
            )
    return 0.0
