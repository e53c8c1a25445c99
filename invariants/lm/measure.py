"""What the decoder-only checks share: the keys a query may see, comparisons over real positions, and records."""

from __future__ import annotations

import torch
from torch import Tensor

from invariants.subject import relative_error
from model.lm.config import LMConfig
from model.lm.protocol import CausalLM, LMAttentionRecord


def visible(pad: Tensor, cfg: LMConfig, queries: int | None = None) -> Tensor:
    """(B, T_q, T_k) bool: key j visible to query i, for the last `queries` of the T_k positions (all by default): j is
    not padding, j <= i (section 3.2.3) and, with a window, i - j < window. i and j index the sequence, not positions."""
    keys = pad.size(1)
    queries = keys if queries is None else queries
    i = torch.arange(keys - queries, keys)[:, None]
    j = torch.arange(keys)[None, :]
    allowed = j <= i
    if cfg.window:
        allowed = allowed & (i - j < cfg.window)
    return allowed[None] & ~pad[:, None, :]


def real_error(actual: Tensor, expected: Tensor, pad: Tensor) -> float:
    """relative_error over the real (non-pad) positions of (B, T, ...) tensors; 0 when there are none."""
    keep = ~pad
    return relative_error(actual[keep], expected[keep]) if bool(keep.any()) else 0.0


def recorded(model: CausalLM, ids: Tensor, pad: Tensor, positions: Tensor | None = None) -> list[LMAttentionRecord]:
    """Each self-attention layer's record of one eval-mode forward pass, in layer order."""
    model.eval()
    with model.attention_records() as records:
        model(ids, pad, positions)
    return sorted(records, key=lambda r: r.layer)


def worst_index(error: Tensor) -> tuple[int, ...]:
    """The index of the largest entry of `error`."""
    return tuple(int(i) for i in torch.unravel_index(error.argmax(), error.shape))


def other_tokens(ids: Tensor, cfg: LMConfig, gen: torch.Generator) -> Tensor:
    """Each id replaced by a different non-pad id (ids hold no pad_id where this is used)."""
    index = ids - (ids > cfg.pad_id).long()  # position among the vocab_size - 1 non-pad ids
    shift = torch.randint(1, cfg.vocab_size - 1, ids.shape, generator=gen)
    shifted = (index + shift) % (cfg.vocab_size - 1)
    return shifted + (shifted >= cfg.pad_id).long()
