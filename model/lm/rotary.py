"""Rotary position embeddings (Su et al. 2021, RoFormer): queries and keys turned pairwise by angles proportional to
their positions, so that the dot product of a query at m and a key at n depends on m - n only (RoFormer eq. 16)."""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_angles(positions: Tensor, d_head: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of position * theta_i, theta_i = base^(-2i/d_head) (eq. 15), as (B, 1, T, d_head/2) for the heads
    to broadcast over. Computed in float64 for a float64 model, else in float32 (as HF does), then cast to dtype."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    theta = base ** (-torch.arange(0, d_head, 2, dtype=work, device=positions.device) / d_head)  # (d_head/2,)
    angle = positions.to(work)[:, None, :, None] * theta  # (B, 1, T, d_head/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """x (B, h, T, d) with each pair (x1, x2) turned to (x1 cos - x2 sin, x1 sin + x2 cos), eq. 14. The pairs are
    (2i, 2i+1) for layout "interleaved" (RoFormer), (i, i + d/2) for "half" (GPT-NeoX, HF Llama's rotate_half)."""
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
    x1, x2 = x.chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)
