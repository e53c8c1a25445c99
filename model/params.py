"""Parameter counting that counts a shared tensor once, in total and by part; a copy of a model in another dtype."""

from __future__ import annotations

from copy import deepcopy
from typing import Mapping, TypeVar

import torch
from torch.nn import Module, Parameter

from model.config import TransformerConfig


def count_parameters(groups: Mapping[str, list[Parameter]]) -> dict[str, int]:
    """{'total': n, part: n, ...}; a tensor shared between parts is counted in the first part that lists it."""
    seen: set[int] = set()
    counts: dict[str, int] = {}
    for part, params in groups.items():
        fresh = [p for p in params if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in fresh)
        counts[part] = sum(p.numel() for p in fresh)
    return {"total": sum(counts.values()), **counts}


def training_flops(cfg: TransformerConfig, counts: Mapping[str, int], src_tokens: float, tgt_tokens: float) -> float:
    """Model FLOPs of a training step: 6 x (weights each token passes through) per token, attention scores left out.

    Source tokens pass through the encoder's matrices, target tokens through the decoder's and the
    pre-softmax projection (vocab x d_model); `counts` is count_parameters' result. The scores' T^2
    terms are under 5% at sentence lengths.
    """
    return 6.0 * (counts["encoder"] * src_tokens + (counts["decoder"] + cfg.vocab_size * cfg.d_model) * tgt_tokens)


M = TypeVar("M", bound=Module)


def working_copy(model: M, dtype: torch.dtype = torch.bfloat16) -> M:
    """A copy of the model with its parameters in `dtype` and its buffers as they are. deepcopy copies a shared
    parameter once, so weights tied in the model (section 3.4's one embedding matrix) stay tied in the copy."""
    copy = deepcopy(model)
    for p in copy.parameters():
        p.data, p.grad = p.data.to(dtype), None  # a gradient the model holds is not the copy's
    return copy
