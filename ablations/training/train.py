"""Training with the paper's recipe (section 5.3): Adam(0.9, 0.98, 1e-9) and the warm-up learning rate, resumable.

`train_step` is one optimizer step over a list of micro-batches (gradient accumulation); it takes the
module to call, so a compiled or DistributedDataParallel wrapper can be passed in place of the model.
`train` is the loop: logging to metrics.jsonl, dev perplexity, checkpoints (ablations/training/checkpoints.py: a
resumed run continues exactly), divergence detection. With `ranks` from ablations.training.distributed, the same
loop trains data-parallel under torchrun.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, NoReturn

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ablations.data.batching import BatchStream
from ablations.runs.folder import CHECKPOINT, Run, append_metrics, truncate_metrics
from ablations.scoring.evaluate import perplexity
from ablations.training.checkpoints import TrainState, resume, save_checkpoint
from ablations.training.clock import Laps, StepClock
from ablations.training.compiling import compile_model, compiles
from ablations.training.distributed import SINGLE, Ranks, first_signal, step_seed, sum_over_ranks, wrap
from ablations.training.precision import for_training
from ablations.training.prefetch import Prefetcher, StepBatches
from model.batch import Batch
from model.objective import ADAM_BETAS, ADAM_EPS, learning_rate
from model.transformer import HALF, Transformer
from plumbing import stopping

DIVERGED_LOSS = 3.0  # a training loss above this many times ln(vocab) (uniform guessing) counts as divergence


class Diverged(RuntimeError):
    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"training diverged at step {step}: loss {loss}")
        self.step, self.loss = step, loss


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Adam:
    """Adam with the paper's betas and epsilon, as torch's fused kernel (one pass per parameter, on CPU and GPU
    alike; torch's default is a loop of several ops per parameter). The learning rate is set every step."""
    return torch.optim.Adam(
        model.parameters(), lr=0.0, betas=ADAM_BETAS, eps=ADAM_EPS, fused=device.type in ("cpu", "cuda")
    )


def loss_of(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor] | None:
    """The loss `train_step` applies to the model's logits; None for the reference model, which takes the labels and
    returns its loss without holding the whole logits at once (`Transformer.forward`). A subclass with a forward of
    its own, or another loss, gets its logits scored by its `loss`."""
    takes_labels = (
        isinstance(model, Transformer) and type(model).forward is Transformer.forward and model.loss_is_chunked()
    )
    return None if takes_labels else model.loss


def train_step(
    model: Callable[..., Tensor],
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[Batch],
    lr: float,
    autocast: torch.dtype | None = None,
    step_tokens: int | None = None,
    ranks: Ranks = SINGLE,
) -> Tensor:
    """One optimizer step; returns the training loss per target token over all micro-batches, as a 0-d tensor on the
    device: reading it (float(), .item()) waits for the GPU, so the loop reads it at logging steps only.

    Each micro-batch's mean loss is weighted by its share of the step's target tokens, so the gradient
    is the same as that of one batch holding them all. Data-parallel, micro_batches are this rank's
    share and step_tokens the target tokens of the whole step: DDP averages gradients over the ranks,
    so each rank scales its share by their number, and the loss returned is the whole step's.
    `loss_fn` None: the model returns its own loss given the labels (`loss_of`).
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    total = step_tokens or sum(b.tgt_tokens for b in micro_batches)
    loss_sum = torch.zeros((), dtype=torch.float64, device=micro_batches[0].src.device)
    for i, b in enumerate(micro_batches):
        device_type = b.src.device.type
        last = i == len(micro_batches) - 1  # DDP all-reduces the accumulated gradients once, after the last backward
        with model.no_sync() if ranks.parallel and not last else nullcontext():
            with torch.autocast(device_type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                output = b.forward(model, with_labels=loss_fn is None)
            loss = output if loss_fn is None else loss_fn(output.float() if output.dtype in HALF else output, b.labels)
            (loss * (b.tgt_tokens * ranks.world / total)).backward()
        loss_sum += loss.detach() * b.tgt_tokens
    optimizer.step()
    return sum_over_ranks(loss_sum, ranks) / total


def add_times(state: TrainState, laps: Laps, window: Laps) -> None:
    """Add the step times just read to the run's clock and to the window being logged."""
    window.add(laps)
    state.wall_s += sum(laps.steps) + sum(laps.compiling)
    state.compile_s += sum(laps.compiling)
    state.compiles += laps.compiles
    state.steady_s += sum(laps.steps)
    state.steady_tokens += laps.steady_tokens


@dataclass(frozen=True)
class Loop:
    """What every step of `train` works with: the model, its forward (wrapped, compiled), the optimizer, the data,
    and the run it writes to."""

    model: nn.Module
    forward: Callable[..., Tensor]
    optimizer: torch.optim.Optimizer  # or precision.MasterWeights, which steps the model through its working copy
    stream: BatchStream  # read by the prefetching thread while the loop runs: the steps read only its seed
    run: Run
    dev: tuple[list[list[int]], list[list[int]]]
    device: torch.device
    ranks: Ranks


@dataclass(frozen=True)
class Step:
    """A step just taken: its loss (on the device, not read yet), its learning rate, and whether it is logged and
    checkpointed."""

    loss: Tensor
    lr: float
    logged: bool
    saved: bool


def train(
    model: nn.Module,
    run: Run,
    stream: BatchStream,
    dev: tuple[list[list[int]], list[list[int]]],
    device: torch.device,
    on_step: Callable[[int], None] | None = None,
    ranks: Ranks = SINGLE,
) -> TrainState:
    """Train until the run's settings.steps, resuming from its checkpoint if there is one; raises Diverged, or Stopped
    after a stop signal (the step it arrived in is finished and checkpointed first).

    Data-parallel (ranks.parallel), every rank resumes from the same checkpoint, reads the same stream and
    trains on its share of each step's micro-batches; rank 0 alone logs, evaluates and checkpoints. The host waits
    for the device only at logging and checkpoint steps; data-parallel, that is also where the ranks agree on a stop,
    so a stop signal ends the run at the next of those steps. Each step's batches are prepared on a background thread
    while the step before it runs (`Prefetcher`), off the step's clock.
    """
    loop, state = start(model, run, stream, dev, device, ranks)
    bar = tqdm(
        total=run.settings.steps,
        initial=state.step,
        desc=run.label,
        unit="step",
        leave=False,
        dynamic_ncols=True,
        disable=not ranks.main,
    )
    ahead = Prefetcher(stream, run.settings.steps - state.step, run.settings.accumulation, ranks, device)
    try:  # the bar is closed and the prefetching thread ended however the loop ends (divergence, a stop, a full disk)
        window, clock = Laps(), StepClock(device)
        model.train()
        while state.step < run.settings.steps:
            with stopping.step():  # a stop signal lets the step finish: a checkpoint of it continues the run exactly
                step = take_step(loop, state, clock, ahead.take())
                ahead.wait()  # the next step is prepared beside this one only, not beside logging, evaluation, saving
                window = log_and_save(loop, state, step, clock, window, bar)
            # Every rank stops after the same step; agreeing on it is a collective, so data-parallel it waits for
            # the steps where the host waits for the device anyway.
            agree = step.logged or step.saved or not ranks.parallel
            signum = first_signal(stopping.requested(), ranks, device) if agree else None
            if signum:
                stop_cleanly(loop, state, step, clock, window, signum)
            bar.update(1)
            if on_step is not None:
                on_step(state.step)
    finally:
        ahead.close()
        bar.close()
    return state


def start(
    model: nn.Module,
    run: Run,
    stream: BatchStream,
    dev: tuple[list[list[int]], list[list[int]]],
    device: torch.device,
    ranks: Ranks,
) -> tuple[Loop, TrainState]:
    """The loop's parts and the run's progress: resumed from its checkpoint, metrics.jsonl cut back to that step and
    the stream sought to its position, so that training continues exactly where the checkpoint left it; under
    'bf16-weights' a bf16 copy of the model takes the steps, and the optimizer steps the model (precision.py)."""
    optimizer = make_optimizer(model, device)
    state = resume(run.directory, model, optimizer, run.label, run.key)
    if ranks.main:
        truncate_metrics(run.directory, state.step)
    stream.seek(state.epoch, state.index)
    forward, optimizer = for_training(model, optimizer, run.settings.precision)
    forward = wrap(forward, ranks, device)
    forward = compile_model(forward) if run.settings.compile else forward
    return Loop(model, forward, optimizer, stream, run, dev, device, ranks), state


def take_step(loop: Loop, state: TrainState, clock: StepClock, data: StepBatches) -> Step:
    """One timed optimizer step on the step's micro-batches, prepared beforehand (`Prefetcher`), at the warm-up
    learning rate (section 5.3); the state advances past it, to the stream's position after those batches."""
    settings, ranks = loop.run.settings, loop.ranks
    clock.start()  # each step timed from its own start: evaluation, saving, logging and preparing data are not steps
    if ranks.parallel:  # each rank its own dropout masks, the same ones again after a resume
        torch.manual_seed(step_seed(loop.stream.seed, state.step, ranks.rank))
    lr = learning_rate(state.step + 1, loop.model.config.d_model, settings.warmup, settings.lr_peak)
    graphs = compiles()
    step_loss = train_step(
        loop.forward,
        loss_of(loop.model),
        loop.optimizer,
        data.batches,
        lr,
        settings.step_autocast,
        data.tgt_tokens,
        ranks,
    )
    tokens = data.src_tokens + data.tgt_tokens
    clock.lap(compiles() - graphs, tokens)
    state.step, state.tokens_seen = state.step + 1, state.tokens_seen + tokens
    state.epoch, state.index = data.epoch, data.index
    logged = state.step % settings.log_every == 0 or state.step == settings.steps
    saved = state.step % settings.checkpoint_every == 0 or state.step == settings.steps
    return Step(step_loss, lr, logged, saved)


def log_and_save(loop: Loop, state: TrainState, step: Step, clock: StepClock, window: Laps, bar: tqdm) -> Laps:
    """After a step: log it to metrics.jsonl (with dev perplexity at evaluation steps), raise Diverged on a runaway
    loss, checkpoint it; returns the window of step times the next log reports."""
    settings, run, model = loop.run.settings, loop.run, loop.model
    # The loss and the step times are read back (a wait for the GPU) only where they are logged or saved.
    loss = step.loss.item() if step.logged or step.saved else 0.0
    if step.logged or step.saved:
        add_times(state, clock.read(), window)
    diverged = not math.isfinite(loss) or loss > DIVERGED_LOSS * math.log(model.config.vocab_size)
    if loop.ranks.main and (diverged or step.logged):
        record = {"step": state.step, "loss": loss, "lr": step.lr, **window.summary(), "time_s": state.wall_s}
        if not diverged and (state.step % settings.eval_every == 0 or state.step == settings.steps):
            record["dev_ppl"] = perplexity(
                model, *loop.dev, loop.device, settings.micro_tokens, settings.autocast, progress=run.label
            )
            model.train()
        append_metrics(run.directory, record)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s'] or 0:,.0f}")
    if step.logged:
        window = Laps()
    if diverged:
        raise Diverged(state.step, loss)
    if loop.ranks.main and step.saved:
        save_checkpoint(run.directory / CHECKPOINT, model, loop.optimizer, state, run.key)
    return window


def stop_cleanly(loop: Loop, state: TrainState, step: Step, clock: StepClock, window: Laps, signum: int) -> NoReturn:
    """End the run after a stop signal: log the steps since the last log, checkpoint the step unless it just was, and
    raise Stopped, so that a re-run continues exactly."""
    run, main = loop.run, loop.ranks.main
    if main and not step.saved:
        add_times(state, clock.read(), window)
    if main and not step.logged and (window.steps or window.compiling):  # the steps since the last log
        record = {"step": state.step, "loss": step.loss.item(), "lr": step.lr, **window.summary()}
        append_metrics(run.directory, {**record, "time_s": state.wall_s, "stopped": True})
    if main and not step.saved:
        save_checkpoint(run.directory / CHECKPOINT, loop.model, loop.optimizer, state, run.key)
    raise stopping.Stopped(signum, f"{run.label} at step {state.step}, checkpoint saved")
