"""The training objective and schedule of section 5: label-smoothed cross-entropy and the warm-up learning rate."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """Cross-entropy against (1 - eps) * one-hot + eps / vocab, averaged over non-pad target tokens."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=eps)


def learning_rate(step: int, d_model: int, warmup: int = 4000, peak: float | None = None) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), eq. (3); steps count from 1.

    The same shape is peak * min(step / warmup, sqrt(warmup / step)); `peak` replaces eq. (3)'s
    d_model^-0.5 * warmup^-0.5 where a scaled-down model needs another peak (the cpu budget).
    """
    step = max(step, 1)
    if peak is None:
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    return peak * min(step / warmup, (warmup / step) ** 0.5)
