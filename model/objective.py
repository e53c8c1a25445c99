"""The training objective and optimizer of section 5: label-smoothed cross-entropy, Adam's settings and the warm-up
learning rate."""

from __future__ import annotations

import torch
from torch import Tensor

from model import kernels


class _LabelSmoothedLoss(torch.autograd.Function):
    """Label-smoothed cross-entropy in one pass over the logits forward and one backward.

    F.cross_entropy(label_smoothing=eps) builds its gradient from a scattered one-hot, a broadcast smoothing term and
    their sum, each as large as the logits; here the gradient w * (softmax - q) is written once, from each row's
    maximum and log-sum-exp: by the CPU kernel (model/kernels/) with `by_kernel`, else by torch ops.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, pad_id: int, eps: float, by_kernel: bool) -> Tensor:
        flat, target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
        weight = target.ne(pad_id).to(logits.dtype)
        weight = weight / weight.sum()  # 0/0 = nan with no target token, as F.cross_entropy gives
        rows, top, log_sum = kernels.smoothed_nll(flat, target, eps) if by_kernel else row_losses(flat, target, eps)
        ctx.save_for_backward(flat, target, weight, top, log_sum)
        ctx.eps, ctx.shape, ctx.by_kernel = eps, logits.shape, by_kernel
        return rows.mul_(weight).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        flat, target, weight, top, log_sum = ctx.saved_tensors
        scale, eps = weight * grad, ctx.eps  # (N,)
        if ctx.by_kernel:
            out = kernels.smoothed_nll_backward(flat, target, top, log_sum, scale, eps)
            return out.view(ctx.shape), None, None, None, None
        softmax = torch.exp((flat - top.unsqueeze(1)).sub_(log_sum.unsqueeze(1)))  # x - m first: no digits lost
        out = softmax.sub_(eps / flat.size(-1)).mul_(scale.unsqueeze(1))  # w * (softmax - eps / V) ...
        out.scatter_add_(1, target.unsqueeze(1), (-(1 - eps) * scale).unsqueeze(1))  # ... - w * (1 - eps) * one-hot
        return out.view(ctx.shape), None, None, None, None


def row_losses(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of logits (N, V): (1 - eps) * -log p(target) + eps * mean_v -log p(v), the row's maximum m and
    log sum exp(logits - m); from the logits less m, so that large logits lose nothing to cancellation."""
    top = logits.max(-1).values
    shifted = logits - top.unsqueeze(1)
    log_sum = torch.logsumexp(shifted, dim=-1)
    nll = log_sum - shifted.gather(1, target.unsqueeze(1)).squeeze(1)
    return (1 - eps) * nll + eps * (log_sum - shifted.mean(-1)), top, log_sum


def label_smoothed_loss(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """Cross-entropy against (1 - eps) * one-hot + eps / vocab, averaged over non-pad target tokens (section 5.4)."""
    return _LabelSmoothedLoss.apply(logits, target, pad_id, eps, kernels.takes_loss(logits))


def label_smoothed_loss_by_torch_ops(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """`label_smoothed_loss` without the CPU kernel (the benchmark's before, and the tests' check of both)."""
    return _LabelSmoothedLoss.apply(logits, target, pad_id, eps, False)


ADAM_BETAS, ADAM_EPS = (0.9, 0.98), 1e-9  # the paper's Adam (section 5.3): beta1, beta2 and epsilon


def learning_rate(step: int, d_model: int, warmup: int = 4000, peak: float | None = None) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), eq. (3); steps count from 1.

    The same shape is peak * min(step / warmup, sqrt(warmup / step)); `peak` replaces eq. (3)'s
    d_model^-0.5 * warmup^-0.5 where a scaled-down model needs another peak (the cpu budget).
    """
    step = max(step, 1)
    if peak is None:
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    return peak * min(step / warmup, (warmup / step) ** 0.5)
