"""Parameter counting that counts a shared tensor once, in total and by part."""
from __future__ import annotations

from typing import Mapping

from torch.nn import Parameter


def count_parameters(groups: Mapping[str, list[Parameter]]) -> dict[str, int]:
    """{'total': n, part: n, ...}; a tensor shared between parts is counted in the first part that lists it."""
    seen: set[int] = set()
    counts: dict[str, int] = {}
    for part, params in groups.items():
        fresh = [p for p in params if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in fresh)
        counts[part] = sum(p.numel() for p in fresh)
    return {"total": sum(counts.values()), **counts}
