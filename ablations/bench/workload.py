"""What both benches time every system on, alike: repetitions in alternating order, and beam-search sources of one
length."""

from __future__ import annotations

import torch

from ablations.data.bpe import EOS


def alternate(items, repetition: int) -> list:
    """Systems in order on even repetitions and reversed on odd ones, so that no system always follows the same one."""
    items = list(items)
    return items if repetition % 2 == 0 else items[::-1]


def fixed_length_sources(src: list[list[int]], n: int, length: int) -> torch.Tensor:
    """n dev sources of at least `length` tokens, cut to `length` (ending in EOS): no padding, one output length."""
    rows = [s[: length - 1] + [EOS] for s in src if len(s) >= length][:n]
    if len(rows) < n:
        raise ValueError(
            f"only {len(rows)} dev sentences have {length} tokens; lower --decode-length or --decode-sentences"
        )
    return torch.tensor(rows)
