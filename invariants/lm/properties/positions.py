"""Positions: the model's only sense of order is the positions it is given (section 3.5), and rotary positions make
attention depend on relative positions alone, by the rotations RoFormer defines (Su et al. 2021, eqs. 14-15)."""

from __future__ import annotations

import torch
from torch import Tensor

from invariants import tolerances as tol
from invariants.guard import Skipped
from invariants.lm.cases import LMCase, lm_cases, pinned_lm_cases
from invariants.lm.groups import POSITIONS
from invariants.lm.measure import real_error, recorded
from invariants.lm.properties import lm_invariant
from invariants.lm.subject import LMSubject
from invariants.subject import relative_error
from model.lm.protocol import default_positions

AGREEMENT = tol.AGREEMENT[torch.float64]
MAX_SHIFT = 16


def rotary_only(subject: LMSubject) -> str | None:
    if subject.config.positions != "rotary":
        return f"the model's positions are {subject.config.positions}, not rotary"
    return None


def rotate(x: Tensor, positions: Tensor, layout: str, base: float) -> Tensor:
    """x (B, h, T, d) rotated as RoFormer defines it: pair i of each vector turned by position * base^(-2i/d), the
    pairs (2i, 2i+1) ('interleaved', eq. 14) or (i, i + d/2) ('half')."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions[:, None, :, None].double() * theta
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    first, second = (x[..., 0::2], x[..., 1::2]) if layout == "interleaved" else (x[..., : d // 2], x[..., d // 2 :])
    turned = (first * cos - second * sin, first * sin + second * cos)
    return torch.stack(turned, -1).flatten(-2) if layout == "interleaved" else torch.cat(turned, -1)


@lm_invariant(
    POSITIONS,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s),
    applicable=rotary_only,
)
def rotary_relative(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """Shifting every position by k leaves the logits unchanged at real positions: with rotary positions attention sees relative positions only (RoFormer, section 3.4.2)."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    shift = 1 + case.seed % min(MAX_SHIFT, model.config.max_len - case.length)
    model.eval()
    error = real_error(model(ids, pad, default_positions(pad) + shift), model(ids, pad, default_positions(pad)), pad)
    return error, f"every position shifted by {shift}"


@lm_invariant(
    POSITIONS,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s),
    cases=lambda s: lm_cases(s),
    needs=("attention_records",),
    applicable=rotary_only,
)
def rotary_rotation(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """The first layer's queries and keys at position p are those at position 0 turned by RoFormer's rotation in the declared layout and base (eqs. 14-15): norms kept, on the values nothing."""
    model, (ids, pad) = subject.model(case.config), case.make_batch(subject)
    cfg, positions = model.config, default_positions(pad) + case.seed % MAX_SHIFT
    at_zero = recorded(model, ids, pad, torch.zeros_like(positions))[0]  # the rotation at position 0 is the identity
    at_p = recorded(model, ids, pad, positions)[0]
    real = ~pad[:, None, :, None]
    worst, where = 0.0, ""
    for name in ("q", "k", "v"):
        before, after = getattr(at_zero, name), getattr(at_p, name)
        expected = before if name == "v" else rotate(before, positions, cfg.rotary_layout, cfg.rotary_base)
        error = relative_error(after * real, expected * real)
        if error > worst or error != error:
            worst, where = (
                error,
                f"the {'values' if name == 'v' else name + 's'}: {explain(name, before, after, positions, cfg, real)}",
            )
    return worst, where


def explain(name: str, before: Tensor, after: Tensor, positions: Tensor, cfg, real: Tensor) -> str:
    """What the recorded vectors fit instead: the other layout, or rotated values."""
    if name == "v":
        return "they change with the positions: rotary positions turn queries and keys only"
    other = "half" if cfg.rotary_layout == "interleaved" else "interleaved"
    if relative_error(after * real, rotate(before, positions, other, cfg.rotary_base) * real) < 1e-6:
        return f"they are turned in the {other} layout, the config says {cfg.rotary_layout}"
    norms = relative_error(after.norm(dim=-1) * real[..., 0], before.norm(dim=-1) * real[..., 0])
    return (
        "the norms change: not a rotation" if norms > 1e-6 else "a rotation, but not RoFormer's at this layout and base"
    )


@lm_invariant(
    POSITIONS,
    AGREEMENT,
    pinned=lambda s: pinned_lm_cases(s, padded=False),
    cases=lambda s: lm_cases(s, padded=False, min_length=3),
)
def order_only_from_positions(subject: LMSubject, case: LMCase) -> float | tuple[float, str]:
    """With every position 0 a one-layer model has no sense of order: permuting the earlier tokens leaves the last position's logits unchanged (section 3.5: attention alone sees a set).

    One layer: in a deeper stack the earlier positions' own outputs depend on their order through the causal mask.
    """
    model, (ids, pad) = subject.model({**case.config, "n_layers": 1}), case.make_batch(subject)
    window = model.config.window
    length = min(case.length, window) if window else case.length  # beyond a window, a permutation changes what it holds
    if length < 3:
        raise Skipped(f"window {window}", "a window under 3 tokens leaves no earlier tokens to permute")
    ids, pad = ids[:, -length:], pad[:, -length:]
    order = torch.randperm(length - 1, generator=torch.Generator().manual_seed(case.seed))
    if bool((order == torch.arange(length - 1)).all()):
        order = order.roll(1)
    permuted = torch.cat([ids[:, :-1][:, order], ids[:, -1:]], 1)
    zeros = torch.zeros_like(ids)
    model.eval()
    error = relative_error(model(permuted, pad, zeros)[:, -1], model(ids, pad, zeros)[:, -1])
    return error, f"the earlier {length - 1} tokens in the order {order.tolist()}"
