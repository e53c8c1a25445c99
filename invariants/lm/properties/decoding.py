"""Cached and greedy decoding: a key/value cache fed a prompt and then one token at a time computes what the full pass
computes, also after beam search reorders its rows, and greedy generation picks the full pass's argmax."""

from __future__ import annotations

import torch

from invariants import tolerances as tol
from invariants.lm.cases import LMCase, lm_cases, pinned_lm_cases
from invariants.lm.groups import DECODING
from invariants.lm.measure import real_error
from invariants.lm.properties import lm_invariant
from invariants.lm.subject import LMSubject

AGREEMENT = tol.AGREEMENT[torch.float64]
STEPS = 6  # tokens generated per case


def prompt_length(case: LMCase) -> int:
    """Where the prompt ends: 1 .. length - 1, from the case's seed."""
    return 1 + case.seed % (case.length - 1)


@lm_invariant(
    DECODING,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s),
    needs=("kv_cache",),
)
def cached_decoding(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """A prompt, then one token at a time through the cache, gives the full pass's logits at every real position (prompts padded on each side the model supports)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    start = prompt_length(case)
    model.eval()
    cache = model.new_cache()
    steps = [model(ids[:, :start], pad[:, :start], None, cache)]
    for t in range(start, case.length):
        steps.append(model(ids[:, t : t + 1], pad[:, : t + 1], None, cache))
    cached, full = torch.cat(steps, 1), model(ids, pad)
    error = real_error(cached, full, pad)
    position = int((cached - full).abs().amax(-1).masked_fill(pad, 0).amax(0).argmax())
    return error, f"a prompt of {start}, then {case.length - start} cached steps; the worst position {position}"


@lm_invariant(
    DECODING,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s, min_batch=2),
    needs=("kv_cache",),
)
def cached_after_reorder(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """After reorder_cache keeps rows index[r] (beam search drops and repeats hypotheses), cached steps give the full pass's logits of the reordered sequences."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    start, rows = prompt_length(case), ids.size(0)
    index = torch.randint(0, rows, (rows,), generator=torch.Generator().manual_seed(case.seed))
    ids2 = torch.cat([ids[index, :start], ids[:, start:]], 1)
    pad2 = torch.cat([pad[index, :start], pad[:, start:]], 1)
    model.eval()
    cache = model.new_cache()
    model(ids[:, :start], pad[:, :start], None, cache)
    cache = model.reorder_cache(cache, index)
    steps = [model(ids2[:, t : t + 1], pad2[:, : t + 1], None, cache) for t in range(start, case.length)]
    error = real_error(torch.cat(steps, 1), model(ids2, pad2)[:, start:], pad2[:, start:])
    return error, f"rows {index.tolist()} kept after a prompt of {start}"


@lm_invariant(
    DECODING,
    AGREEMENT,
    pinned=lambda s: [c for c in pinned_lm_cases(s) if not c.padded or c.side == "left"],
    cases=lambda s: (
        lm_cases(s, sides=("left",), padded=True, min_batch=2)
        if "left" in s.padding_sides
        else lm_cases(s, padded=False)
    ),
    needs=("generate",),
)
def greedy_generation(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Each token the model's own greedy generation picks after left-padded prompts has the highest logit of the full pass over prompt and generated tokens (a gap above round-off is a wrong pick).

    On sharpened weights (LMSubject.sharpened): at the init a wrong position or mask in generation seldom changes a pick.
    """
    model, (ids, pad) = subject.sharpened(case.config), case.make_batch(subject)
    model.eval()
    new = model.generate(ids, pad, STEPS)
    if tuple(new.shape) != (ids.size(0), STEPS):
        return float("inf"), f"generate returned shape {tuple(new.shape)}, expected {(ids.size(0), STEPS)}"
    sequence = torch.cat([ids, new], 1)
    logits = model(sequence, torch.cat([pad, torch.zeros_like(new, dtype=torch.bool)], 1))
    picked = logits[:, case.length - 1 : -1]
    if not torch.isfinite(picked).all():
        return float("inf"), "the full pass's logits are not finite"
    gap = picked.amax(-1) - picked.gather(-1, new[..., None]).squeeze(-1)  # (B, STEPS), 0 where the argmax was picked
    error = gap.max().item() / max(1.0, picked.abs().max().item())
    b, step = divmod(int(gap.flatten().argmax()), STEPS)
    return (
        error,
        f"step {step} of row {b}: picked {int(new[b, step])}, the full pass's argmax {int(picked[b, step].argmax())}",
    )
