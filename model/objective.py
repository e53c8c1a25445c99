"""The training objective and optimizer of section 5: label-smoothed cross-entropy, Adam's settings and the warm-up
learning rate."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

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
        out = logit_gradient(flat, target, top, log_sum, weight * grad, ctx.eps, ctx.by_kernel)
        return out.view(ctx.shape), None, None, None, None


def row_losses(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of logits (N, V): (1 - eps) * -log p(target) + eps * mean_v -log p(v), the row's maximum m and
    log sum exp(logits - m); from the logits less m, so that large logits lose nothing to cancellation."""
    top = logits.max(-1).values
    shifted = logits - top.unsqueeze(1)
    log_sum = torch.logsumexp(shifted, dim=-1)
    nll = log_sum - shifted.gather(1, target.unsqueeze(1)).squeeze(1)
    return (1 - eps) * nll + eps * (log_sum - shifted.mean(-1)), top, log_sum


def logit_gradient(
    logits: Tensor, target: Tensor, top: Tensor, log_sum: Tensor, scale: Tensor, eps: float, by_kernel: bool
) -> Tensor:
    """The gradient of sum_n scale[n] * row_losses(logits)[n] with respect to the logits (N, V), written once:
    scale * (softmax - eps / V - (1 - eps) * one-hot), from each row's maximum and log-sum-exp."""
    if by_kernel:
        return kernels.smoothed_nll_backward(logits, target, top, log_sum, scale, eps)
    softmax = torch.exp((logits - top.unsqueeze(1)).sub_(log_sum.unsqueeze(1)))  # x - m first: no digits lost
    out = softmax.sub_(eps / logits.size(-1)).mul_(scale.unsqueeze(1))  # w * (softmax - eps / V) ...
    out.scatter_add_(1, target.unsqueeze(1), (-(1 - eps) * scale).unsqueeze(1))  # ... - w * (1 - eps) * one-hot
    return out


def label_smoothed_loss(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """Cross-entropy against (1 - eps) * one-hot + eps / vocab, averaged over non-pad target tokens (section 5.4)."""
    return _LabelSmoothedLoss.apply(logits, target, pad_id, eps, kernels.takes_loss(logits))


def label_smoothed_loss_by_torch_ops(logits: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """`label_smoothed_loss` without the CPU kernel (the benchmark's before, and the tests' check of both)."""
    return _LabelSmoothedLoss.apply(logits, target, pad_id, eps, False)


CHUNK_LOGITS = 2**24  # logits made at a time by `linear_label_smoothed_loss`: 64 MB in float32


def chunk_rows(rows: int, per_chunk: int) -> list[slice]:
    """`rows` split into the fewest chunks of at most `per_chunk` rows, their sizes at most one apart, so that each holds
    all the rows or at least half of `per_chunk` (rounded down): no chunk of one row among several (a size that
    torch.compile specialises, a second graph where the scoring is compiled) unless `per_chunk` is under 4, a
    vocabulary of over four million words."""
    count = max(1, -(-rows // per_chunk))
    size, longer = divmod(rows, count)
    bounds = [0]
    for i in range(count):
        bounds.append(bounds[-1] + size + (i < longer))
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def chunk_scores(
    logits: Tensor, target: Tensor, share: Tensor, eps: float, wanted: bool, kernel_allowed: bool = True
) -> tuple[Tensor, Tensor | None]:
    """One chunk of `linear_label_smoothed_loss`: sum_n share[n] * row_losses(logits)[n] and, if wanted, its gradient
    with respect to the logits, in the logits' dtype. The softmax and the loss are computed in float32 (float64 for
    float64 logits); by the CPU kernel where it takes them and is allowed, else by torch ops."""
    scores = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    by_kernel = kernel_allowed and kernels.takes_loss(scores)
    losses, top, log_sum = (kernels.smoothed_nll if by_kernel else row_losses)(scores, target, eps)
    total = (losses * share).sum()
    if not wanted:
        return total, None
    return total, logit_gradient(scores, target, top, log_sum, share, eps, by_kernel).to(logits.dtype)


def chunk_scores_by_torch_ops(
    logits: Tensor, target: Tensor, share: Tensor, eps: float, wanted: bool
) -> tuple[Tensor, Tensor | None]:
    """`chunk_scores` by torch ops alone: what torch.compile compiles into a few passes over the logits, where eager
    torch makes a dozen (the casts, the softmax, each step of the gradient; ablations/training/compiling.py)."""
    return chunk_scores(logits, target, share, eps, wanted, kernel_allowed=False)


Scorer = Callable[[Tensor, Tensor, Tensor, float, bool], tuple[Tensor, Tensor | None]]
_SCORER: ContextVar[Scorer] = ContextVar("chunk scorer", default=chunk_scores)


@contextmanager
def chunks_scored_by(scorer: Scorer) -> Iterator[None]:
    """Within it, `linear_label_smoothed_loss` scores each chunk by `scorer` (a compiled `chunk_scores_by_torch_ops`:
    a compiled training step's loss), not by `chunk_scores`."""
    token = _SCORER.set(scorer)
    try:
        yield
    finally:
        _SCORER.reset(token)


class _LinearLabelSmoothedLoss(torch.autograd.Function):
    """`label_smoothed_loss(hidden @ weight^T, ...)` a chunk of rows at a time: each chunk's logits are made, scored
    and turned into the gradients of hidden and weight within the forward pass, then dropped, so that no more than
    one chunk's logits are ever held; the backward only scales those gradients by the loss's own."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
        device = hidden.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        scores = torch.float64 if compute == torch.float64 else torch.float32  # softmax and loss at float32 or more
        h, w, target = hidden.reshape(-1, hidden.size(-1)).to(compute), weight.to(compute), target.reshape(-1)
        share = target.ne(pad_id).to(scores)
        share = share / share.sum()  # 0/0 = nan with no target token, as F.cross_entropy gives
        wanted = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        total = torch.zeros((), dtype=scores, device=hidden.device)
        grad_h = torch.empty_like(h) if wanted else None
        grad_w = torch.zeros(weight.shape, dtype=scores, device=weight.device) if wanted else None
        score = _SCORER.get()
        with torch.autocast(device, enabled=False):  # each matmul in `compute`, as autocast would run the linear
            for rows in chunk_rows(h.size(0), max(1, CHUNK_LOGITS // weight.size(0))):
                chunk_total, grad = score(h[rows] @ w.T, target[rows], share[rows], eps, wanted)
                total += chunk_total
                if wanted:
                    torch.mm(grad, w, out=grad_h[rows])
                    if grad_w.dtype == compute:  # in place: no (V, d) temporary a chunk
                        grad_w.addmm_(grad.T, h[rows])
                    else:  # bf16 products summed in float32, as autograd sums a bf16 linear's into a float32 .grad
                        grad_w += grad.T @ h[rows]
        if wanted:
            ctx.save_for_backward(grad_h.view(hidden.shape).to(hidden.dtype), grad_w.to(weight.dtype))
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad.to(grad_h.dtype), grad_w * grad.to(grad_w.dtype), None, None, None


# Not compiled with the model: a loop over a number of chunks that follows the batch's size, which would recompile
# at every size; a compiled step compiles the chunk's scoring instead (`chunks_scored_by`).
# torch._disable_dynamo is torch.compiler.disable importing torch._dynamo (2 s of CPU) at the first call, not here:
# a process that imports the model and never trains or compiles (the invariants, the reports) no longer pays for it.
# Under torch.compile the graph breaks at this call as before (the same graphs: tests/ablations/test_gpu_path.py).
@torch._disable_dynamo
def linear_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, eps: float) -> Tensor:
    """`label_smoothed_loss` of the logits hidden @ weight^T (the pre-softmax linear, section 3.4) without holding
    them all: at a 37k vocabulary and 25k target positions their float32 copy alone is 3.7 GB. Under autocast the
    matmuls run in its dtype, as the linear would, and the softmax and loss in float32."""
    return _LinearLabelSmoothedLoss.apply(hidden, weight, target, pad_id, eps)


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
