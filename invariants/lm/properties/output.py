"""Embeddings, output and precision: tied embeddings are one matrix (section 3.4), the untrained model predicts near
uniformly, and half precision keeps the real positions' logits finite however the padding falls."""

from __future__ import annotations

import math

import torch

from invariants import tolerances as tol
from invariants.lm.cases import LMCase, lm_cases, pinned_lm_cases
from invariants.lm.groups import OUTPUT
from invariants.lm.properties import lm_invariant
from invariants.lm.subject import LMSubject
from invariants.subject import relative_error, tokens


@lm_invariant(
    OUTPUT,
    tol.ONE_MATRIX,
    pinned=lambda s: pinned_lm_cases(s, padded=False),
    cases=lambda s: lm_cases(s, padded=False),
    applicable=lambda s: None if s.config.tie_embeddings else "the config does not tie the embeddings",
)
def tied_embeddings(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """The token embedding and the pre-softmax linear are one matrix: equal, and a change to one shows in the other (section 3.4)."""
    model = subject.fresh(case.config)
    weights = model.embedding_weights()
    error = relative_error(weights["output"], weights["input"])
    if error:
        return error, "the embedding and the output matrix differ"
    token = case.seed % model.config.vocab_size
    with torch.no_grad():
        weights["input"][token] += 1.0
    after = model.embedding_weights()
    error = relative_error(after["output"], after["input"])
    return (
        error,
        ""
        if not error
        else f"after a change to the embedding of token {token}, the output matrix kept the old row: a copy, not one matrix",
    )


@lm_invariant(
    OUTPUT,
    tol.LM_INIT_LOSS,
    pinned=lambda s: pinned_lm_cases(s, padded=False),
    cases=lambda s: lm_cases(s, padded=False),
)
def loss_at_init(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """At initialisation the next-token cross-entropy on random tokens is within 10% of log(vocab): the untrained model predicts near uniformly.

    Over 16 x 32 tokens whatever the case's shape: on a handful of tokens the mean's own spread (a logit std over
    vocab sizes of 23) reaches the tolerance.
    """
    model = subject.model(case.config)
    cfg = model.config
    ids = tokens(cfg, (ROWS, min(COLUMNS, cfg.max_len)), torch.Generator().manual_seed(case.seed))
    model.eval()
    logits = model(ids, torch.zeros_like(ids, dtype=torch.bool))[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), ids[:, 1:].flatten()).item()
    uniform = math.log(cfg.vocab_size)
    return abs(loss / uniform - 1), f"cross-entropy {loss:.4g} nats, log(vocab) {uniform:.4g}"


ROWS, COLUMNS = 16, 32  # the random tokens loss_at_init averages over


@lm_invariant(
    OUTPUT,
    tol.COUNT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s, padded=True, min_batch=2),
)
def half_precision_finite(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """In float16 every real position's logits are finite, with padding on each side the model supports (a mask's lowest value must not become -inf and then NaN)."""
    model, (ids, pad) = subject.model(case.config, torch.float16), case.make_batch(subject)
    model.eval()
    logits = model(ids, pad)
    bad = (~torch.isfinite(logits)).any(-1) & ~pad
    if not bad.any():
        return 0.0
    b, position = divmod(int(bad.flatten().nonzero()[0]), ids.size(1))
    return float(
        bad.sum()
    ), f"{int(bad.sum())} real positions with non-finite logits, the first at row {b}, position {position}"
