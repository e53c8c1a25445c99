"""Each training step's micro-batches prepared on a background thread while the step before it runs.

`BatchStream.next` pads a batch's rows into tensors in Python (hundreds of small tensors a step at base size); done
inside the step, that time was on the step's clock and, on a GPU, time in which the host queued no kernels.
`Prefetcher` prepares the next step one step ahead on one thread: the stream's next `accumulation` batches, this
rank's share of them in pinned memory (on CUDA) and copied to the device without blocking, and the step's token
counts. The batches and their order are those the stream gives, and each step carries the stream's position after its
own batches, so a checkpoint records the batches trained on, not the ones prepared ahead.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial

import torch

from ablations.data.batching import BatchStream
from ablations.training.distributed import Ranks, shard
from model.batch import Batch


@dataclass(frozen=True)
class StepBatches:
    """One step's data: this rank's micro-batches on the device, the whole step's token counts (every rank's
    micro-batches), and the stream's position after the step's batches."""

    batches: list[Batch]
    src_tokens: int
    tgt_tokens: int
    epoch: int
    index: int


def pinned(batch: Batch) -> Batch:
    """The batch in page-locked host memory, from which a copy to the GPU with non_blocking=True does not wait."""
    return batch.map(lambda t: t.pin_memory())


def next_step(stream: BatchStream, accumulation: int, ranks: Ranks, device: torch.device) -> StepBatches:
    """The stream's next `accumulation` batches as a step trains on them: this rank's share on `device` (copied
    without blocking, from pinned memory on CUDA), token counts taken on the host, where reading them waits for
    nothing."""
    micro = [stream.next() for _ in range(accumulation)]
    mine = [pinned(b) if device.type == "cuda" else b for b in shard(micro, ranks)]
    return StepBatches(
        [b.to(device) for b in mine],
        sum(b.src_tokens for b in micro),
        sum(b.tgt_tokens for b in micro),
        stream.epoch,
        stream.index,
    )


class Prefetcher:
    """The next `steps` steps' batches of `stream`, each prepared on one background thread while the step before it
    runs; the stream is never read past the last of them.

    Between `Prefetcher(...)` and `close()` the stream belongs to the thread. `take` hands over the next step (waiting
    for it if it is not ready yet; an exception raised in preparing it is raised here) and starts the one after;
    `wait` lets that preparation finish; `close` ends the thread and puts the stream back at the position after the
    steps taken, as if nothing had been prepared ahead.
    """

    def __init__(self, stream: BatchStream, steps: int, accumulation: int, ranks: Ranks, device: torch.device) -> None:
        if device.type == "cuda" and device.index is None:  # a new thread's current GPU is the first, not this one's
            device = torch.device("cuda", torch.cuda.current_device())
        self._prepare = partial(next_step, stream, accumulation, ranks, device)
        self._stream, self._left, self._taken = stream, steps, (stream.epoch, stream.index)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._ahead = self._submit()

    def _submit(self) -> Future[StepBatches] | None:
        if self._left <= 0:
            return None
        self._left -= 1
        return self._thread.submit(self._prepare)

    def take(self) -> StepBatches:
        """The next step's batches; the step after it starts being prepared."""
        if self._ahead is None:
            raise RuntimeError("every step the prefetcher was made for has been taken")
        step = self._ahead.result()
        self._taken, self._ahead = (step.epoch, step.index), self._submit()
        return step

    def wait(self) -> None:
        """Until the next step's batches are prepared, or failed to be (`take` then raises what failed)."""
        if self._ahead is not None:
            wait([self._ahead])

    def close(self) -> None:
        """End the thread (after the preparation under way, if any) and seek the stream back to the steps taken."""
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._stream.seek(*self._taken)
