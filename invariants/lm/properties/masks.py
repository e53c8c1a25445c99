"""The causal mask and padding: no position reads a later one, a prefix computes alone what it computes in the whole,
and padding on either side, or the other rows of a batch, change nothing at a row's real positions."""

from __future__ import annotations

import torch

from invariants import tolerances as tol
from invariants.lm.cases import LMCase, lm_cases, pinned_lm_cases
from invariants.lm.groups import CAUSAL, PADDING
from invariants.lm.measure import other_tokens, real_error
from invariants.lm.properties import lm_invariant
from invariants.lm.subject import LMSubject
from invariants.subject import seeded

AGREEMENT = tol.AGREEMENT[torch.float64]


@lm_invariant(
    CAUSAL,
    tol.CAUSAL_FUTURE,
    pinned=lambda s: pinned_lm_cases(s, train=(False, True)),
    cases=lambda s: lm_cases(s, train=None),
)
def causal_future_tokens(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Changing the tokens at positions >= j leaves the logits at every real position < j bit-identical (float64), in eval and train mode (paper, section 3.2.3)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    cfg = model.config
    j = 1 + case.seed % (case.length - 1)
    future = ~pad & (torch.arange(case.length) >= j)
    changed = torch.where(future, other_tokens(ids, cfg, torch.Generator().manual_seed(case.seed + 1)), ids)
    model.train(case.train)
    outputs = []
    for tokens in (ids, changed):
        with seeded(case.seed):  # the same seed draws the same dropout masks
            outputs.append(model(tokens, pad))
    before = ~pad[:, :j]
    moved = (outputs[0][:, :j] - outputs[1][:, :j]).abs().amax(-1).masked_fill(~before, 0)
    if not torch.isfinite(outputs[0]).all() or not torch.isfinite(outputs[1]).all():
        return float("inf")
    error = moved.max().item()
    if error == 0:
        return error
    b, position = divmod(int(moved.flatten().argmax()), j)
    return (
        error,
        f"changing the tokens from position {j} on moved the logits at position {position} (row {b}) by {error:.3g}",
    )


@lm_invariant(CAUSAL, AGREEMENT, pinned=lambda s: pinned_lm_cases(s), cases=lambda s: lm_cases(s))
def prefix_alone(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """The first j positions run alone give the logits they have inside the whole sequence, at real positions (section 3.2.3: a position's output depends on the earlier ones only, not on how long the input is)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    j = 1 + case.seed % (case.length - 1)
    model.eval()
    whole, alone = model(ids, pad)[:, :j], model(ids[:, :j], pad[:, :j])
    error = real_error(alone, whole, pad[:, :j])
    return error, f"the first {j} of {case.length} positions"


@lm_invariant(
    PADDING,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s)[1:],
    cases=lambda s: lm_cases(s, padded=True, min_batch=2),
)
def padding_invariance(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """A padded row's logits at its real positions equal those of its real tokens alone, unpadded, with padding on each side the model supports (positions count from a row's first real token)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    model.eval()
    batched = model(ids, pad)
    worst, where = 0.0, ""
    for b in range(ids.size(0)):
        real = ~pad[b]
        alone = model(ids[b : b + 1, real], pad[b : b + 1, real])
        error = real_error(batched[b : b + 1, real], alone, pad[b : b + 1, real])
        if error > worst or error != error:
            worst, where = error, f"row {b}, {int(real.sum())} real tokens padded on the {case.side} to {case.length}"
    return worst, where


@lm_invariant(
    PADDING,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s)[1:],
    cases=lambda s: lm_cases(s, min_batch=2),
)
def batch_rows_independent(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Reordering the rows of a batch reorders the logits and changes nothing else (no row reads another)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    order = torch.randperm(ids.size(0), generator=torch.Generator().manual_seed(case.seed))
    if ids.size(0) > 1 and bool((order == torch.arange(ids.size(0))).all()):
        order = order.roll(1)
    model.eval()
    error = real_error(model(ids[order], pad[order]), model(ids, pad)[order], pad[order])
    return error, f"rows in the order {order.tolist()}"
