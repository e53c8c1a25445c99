"""Training with the paper's recipe (section 5.3): Adam(0.9, 0.98, 1e-9) and the warm-up learning rate, resumable.

`train_step` is one optimizer step over a list of micro-batches (gradient accumulation); it takes the
module to call, so a compiled or DistributedDataParallel wrapper can be passed in place of the model.
`train` is the loop: logging to metrics.jsonl, dev perplexity, checkpoints, divergence detection.
A checkpoint holds the model, the optimizer, the step, the RNG states and the batch stream's
position, so that a run resumed from it continues exactly as if it had never stopped (on CPU).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ablations.batching import Batch, BatchStream
from ablations.evaluate import perplexity
from ablations.runs import CHECKPOINT, METRICS, append_metrics, truncate_metrics
from model.objective import learning_rate

ADAM_BETAS, ADAM_EPS = (0.9, 0.98), 1e-9
DIVERGED_LOSS = 3.0  # a training loss above this many times ln(vocab) (uniform guessing) counts as divergence


@dataclass(frozen=True)
class TrainSettings:
    """Everything about a run's training and scoring that is not the model config (written to config.json)."""

    steps: int
    warmup: int
    batch_tokens: int  # source (and target) positions per optimizer step
    accumulation: int  # micro-batches per step
    max_sentence_tokens: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    precision: str  # 'fp32' or 'bf16' (autocast; GPU only)
    compile: bool  # torch.compile (GPU only)
    beam: int = 4
    alpha: float = 0.6
    extra_len: int = 50  # maximum output length = source length + extra_len
    adam_betas: tuple[float, float] = ADAM_BETAS
    adam_eps: float = ADAM_EPS

    @property
    def micro_tokens(self) -> int:
        return max(1, self.batch_tokens // self.accumulation)

    @property
    def autocast(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainState:
    """Progress that a checkpoint carries besides the weights and the optimizer."""

    step: int = 0
    tokens_seen: int = 0  # non-pad source + target tokens trained on
    wall_s: float = 0.0  # seconds spent in training steps, summed over every resumption
    epoch: int = 0  # the batch stream's position
    index: int = 0


class Diverged(RuntimeError):
    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"training diverged at step {step}: loss {loss}")
        self.step, self.loss = step, loss


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Adam:
    """Adam with the paper's betas and epsilon; the fused kernel on a GPU. The learning rate is set every step."""
    return torch.optim.Adam(model.parameters(), lr=0.0, betas=ADAM_BETAS, eps=ADAM_EPS, fused=device.type == "cuda")


def train_step(model: Callable[..., Tensor], loss_fn: Callable[[Tensor, Tensor], Tensor], optimizer: torch.optim.Optimizer,
               micro_batches: list[Batch], lr: float, autocast: torch.dtype | None = None) -> float:
    """One optimizer step; returns the training loss per target token over all micro-batches.

    Each micro-batch's mean loss is weighted by its share of the step's target tokens, so the gradient
    is the same as that of one batch holding them all.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    total = sum(b.tgt_tokens for b in micro_batches)
    loss_sum = torch.zeros((), dtype=torch.float64, device=micro_batches[0].src.device)
    for b in micro_batches:
        device_type = b.src.device.type
        with torch.autocast(device_type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            logits = model(b.src, b.tgt_in, b.src_pad, b.tgt_pad)
        loss = loss_fn(logits if autocast is None else logits.float(), b.tgt_out)  # the loss in fp32 under autocast
        (loss * (b.tgt_tokens / total)).backward()
        loss_sum += loss.detach() * b.tgt_tokens
    optimizer.step()
    return loss_sum.item() / total


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState) -> None:
    """Everything needed to continue the run exactly, written to a temporary file and renamed over the old one."""
    payload = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": asdict(state),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
    """Restore model, optimizer and RNG states in place; returns the progress."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng_cpu"])
    if payload["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["rng_cuda"])
    return TrainState(**payload["state"])


def train(model: nn.Module, settings: TrainSettings, stream: BatchStream, dev: tuple[list[list[int]], list[list[int]]],
          run_dir: Path, device: torch.device, label: str = "", on_step: Callable[[int], None] | None = None) -> TrainState:
    """Train until settings.steps, resuming from run_dir's checkpoint if there is one; raises Diverged."""
    optimizer = make_optimizer(model, device)
    state = TrainState()
    if (run_dir / CHECKPOINT).is_file():
        state = load_checkpoint(run_dir / CHECKPOINT, model, optimizer)
        truncate_metrics(run_dir / METRICS, state.step)
    stream.seek(state.epoch, state.index)
    forward = torch.compile(model) if settings.compile and device.type == "cuda" else model
    vocab = model.config.vocab_size
    bar = tqdm(total=settings.steps, initial=state.step, desc=label, unit="step", leave=False, dynamic_ncols=True)
    window_tokens, window_s = 0, 0.0
    model.train()
    while state.step < settings.steps:
        started = time.perf_counter()
        micro = [stream.next().to(device) for _ in range(settings.accumulation)]
        lr = learning_rate(state.step + 1, model.config.d_model, settings.warmup)
        loss = train_step(forward, model.loss, optimizer, micro, lr, settings.autocast)
        elapsed = time.perf_counter() - started
        tokens = sum(b.src_tokens + b.tgt_tokens for b in micro)
        state.step, state.tokens_seen, state.wall_s = state.step + 1, state.tokens_seen + tokens, state.wall_s + elapsed
        state.epoch, state.index = stream.epoch, stream.index
        window_tokens, window_s = window_tokens + tokens, window_s + elapsed
        diverged = not math.isfinite(loss) or loss > DIVERGED_LOSS * math.log(vocab)
        if diverged or state.step % settings.log_every == 0 or state.step == settings.steps:
            record = {"step": state.step, "loss": loss, "lr": lr, "tokens_per_s": window_tokens / window_s, "time_s": state.wall_s}
            if not diverged and (state.step % settings.eval_every == 0 or state.step == settings.steps):
                record["dev_ppl"] = perplexity(model, *dev, device, settings.micro_tokens, settings.autocast)
                model.train()
            append_metrics(run_dir / METRICS, record)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{window_tokens / window_s:,.0f}")
            window_tokens, window_s = 0, 0.0
        if diverged:
            bar.close()
            raise Diverged(state.step, loss)
        if state.step % settings.checkpoint_every == 0 or state.step == settings.steps:
            save_checkpoint(run_dir / CHECKPOINT, model, optimizer, state)
        bar.update(1)
        if on_step is not None:
            on_step(state.step)
    bar.close()
    return state
