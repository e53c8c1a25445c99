"""Which kernel computes scaled_dot_product_attention on a GPU, chosen on purpose rather than by torch's default.

On Hopper, torch picks cuDNN's attention for a boolean mask, which builds an execution plan for every new shape
(docs/benchmark.md, "On a GPU"); the memory-efficient kernel takes the padding mask without per-shape plans, flash
takes no mask at all. A run records its choice in config.json (`sdpa_backend`); on CPU every choice is torch's own.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from torch.nn.attention import SDPBackend, sdpa_kernel

from ablations.runs.budgets import SDPA_BACKENDS

KERNELS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "math": SDPBackend.MATH,
}


def sdpa_backend(name: str) -> AbstractContextManager:
    """Restrict scaled_dot_product_attention to one backend inside the block ('default': torch chooses)."""
    if name not in SDPA_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; valid: {', '.join(SDPA_BACKENDS)}")
    return nullcontext() if name == "default" else sdpa_kernel([KERNELS[name]])
