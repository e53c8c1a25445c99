"""The training objective and schedule of section 5: label-smoothed cross-entropy and the warm-up learning rate."""
from __future__ import annotations

import torch
from torch import Tensor


class _LabelSmoothedLoss(torch.autograd.Function):
    """Label-smoothed cross-entropy in one log-softmax pass forward and one pass backward.

    F.cross_entropy(label_smoothing=eps) builds its gradient from a scattered one-hot, a broadcast smoothing
    term and their sum, each as large as the logits; here the gradient w * (softmax - q) is written once.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
        V = logits.size(-1)
        logp = torch.log_softmax(logits.reshape(-1, V), dim=-1)
        target = target.reshape(-1, 1)
        weight = target.ne(pad_id).to(logp.dtype)
        weight = weight / weight.sum()  # 0/0 = nan with no target token, as F.cross_entropy gives
        nll = -logp.gather(1, target)
        smooth = -logp.sum(-1, keepdim=True) / V
        ctx.save_for_backward(logp, target, weight)
        ctx.eps, ctx.shape = eps, logits.shape
        return ((1 - eps) * nll + eps * smooth).mul_(weight).sum()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        logp, target, weight = ctx.saved_tensors
        scale = weight * grad  # (N, 1)
        out = logp.exp()
        torch.addcmul(scale * (-ctx.eps / logp.size(-1)), out, scale, out=out)  # w * (softmax - eps / V) ...
        out.scatter_add_(1, target, -(1 - ctx.eps) * scale)  # ... - w * (1 - eps) * one-hot
        return out.view(ctx.shape), None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """Cross-entropy against (1 - eps) * one-hot + eps / vocab, averaged over non-pad target tokens (section 5.4)."""
    return _LabelSmoothedLoss.apply(logits, target, pad_id, eps)


def learning_rate(step: int, d_model: int, warmup: int = 4000, peak: float | None = None) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), eq. (3); steps count from 1.

    The same shape is peak * min(step / warmup, sqrt(warmup / step)); `peak` replaces eq. (3)'s
    d_model^-0.5 * warmup^-0.5 where a scaled-down model needs another peak (the cpu budget).
    """
    step = max(step, 1)
    if peak is None:
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    return peak * min(step / warmup, (warmup / step) ** 0.5)
