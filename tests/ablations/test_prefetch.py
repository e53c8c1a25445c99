"""Batches prepared ahead on a background thread change nothing a run trains on or records: the same batches in the same
order, the same weights, checkpoints at the position of the batches trained on; errors and stops reach the loop."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from functools import partial
from pathlib import Path

import pytest
import torch

from ablations.data.batching import BatchStream
from ablations.runs import folder as R
from ablations.training import checkpoints as C, train as T
from ablations.training.distributed import SINGLE, Ranks
from ablations.training.prefetch import Prefetcher, StepBatches, next_step
from model import Transformer
from model.batch import Batch
from plumbing import stopping
from tests.ablations.test_gpu_path import TINY, tiny_run, varied_pairs
from tests.helpers import needs_cuda

CPU = torch.device("cpu")
DROPOUT = TINY.replace(P_drop=0.1)  # dropout draws from the same generator as ever: a moved draw would show
PAIRS = varied_pairs(60)  # about 20 batches of 120 tokens an epoch: the runs below cross an epoch's end


def stream() -> BatchStream:
    return BatchStream(*PAIRS, 120, seed=1)


def tensors(batch: Batch) -> list[torch.Tensor]:
    return [batch.src, batch.tgt, batch.src_pad, batch.tgt_pad, batch.labels]


def assert_same_batches(got: list[Batch], expected: list[Batch]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b)))  # ids and masks: exact
        assert (a.src_tokens, a.tgt_tokens) == (b.src_tokens, b.tgt_tokens)


def different_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """The names of the weights that are not bit for bit the same."""
    return [name for name, weight in expected.items() if not torch.equal(got[name], weight)]


def prefetcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("prefetch")]


def test_each_step_is_the_streams_next_batches_with_the_position_after_them_and_close_rewinds_to_the_last_taken():
    ahead, plain = stream(), stream()
    prefetcher = Prefetcher(ahead, steps=10, accumulation=3, ranks=SINGLE, device=CPU)
    try:
        for _ in range(8):  # 24 batches: into the second epoch
            step = prefetcher.take()
            expected = [plain.next() for _ in range(3)]
            assert_same_batches(step.batches, expected)
            assert step.src_tokens == sum(b.src_tokens for b in expected)
            assert step.tgt_tokens == sum(b.tgt_tokens for b in expected)
            assert (step.epoch, step.index) == (plain.epoch, plain.index)
        assert plain.epoch == 1
        prefetcher.wait()
        assert (ahead.epoch, ahead.index) != (plain.epoch, plain.index)  # the ninth step prepared ahead
    finally:
        prefetcher.close()
    assert (ahead.epoch, ahead.index) == (plain.epoch, plain.index) and prefetcher_threads() == []
    assert_same_batches([ahead.next()], [plain.next()])


def test_close_rewinds_the_stream_across_an_epochs_end_to_the_batches_taken():
    ahead, plain = stream(), stream()
    prefetcher = Prefetcher(ahead, steps=10, accumulation=3, ranks=SINGLE, device=CPU)
    for _ in range(6):
        prefetcher.take()
    prefetcher.wait()
    assert ahead.epoch == 1  # the seventh step, prepared ahead, took the 19th and last batch of epoch 0 and two more
    prefetcher.close()
    expected = [plain.next() for _ in range(19)][18:]
    assert (ahead.epoch, ahead.index) == (0, 18)
    assert_same_batches([ahead.next()], expected)


def test_the_stream_is_read_no_further_than_the_steps_asked_for():
    ahead = stream()
    prefetcher = Prefetcher(ahead, steps=2, accumulation=2, ranks=SINGLE, device=CPU)
    prefetcher.take(), prefetcher.take()
    prefetcher.wait()
    assert ahead.index == 4
    with pytest.raises(RuntimeError, match="has been taken"):
        prefetcher.take()
    prefetcher.close()


def test_a_rank_is_handed_its_share_of_the_micro_batches_and_the_whole_steps_token_counts():
    whole = next_step(stream(), 4, SINGLE, CPU)
    prefetcher = Prefetcher(stream(), steps=1, accumulation=4, ranks=Ranks(rank=1, world=2), device=CPU)
    share = prefetcher.take()
    prefetcher.close()
    assert_same_batches(share.batches, whole.batches[1::2])
    assert (share.src_tokens, share.tgt_tokens, share.epoch, share.index) == (
        whole.src_tokens,
        whole.tgt_tokens,
        whole.epoch,
        whole.index,
    )


def test_an_error_in_preparing_a_step_is_raised_at_the_take_of_that_step():
    failing, calls = stream(), [0]
    next_batch = failing.next

    def next_or_fail() -> Batch:
        calls[0] += 1
        if calls[0] == 3:
            raise ValueError("a corrupt row")
        return next_batch()

    failing.next = next_or_fail
    prefetcher = Prefetcher(failing, steps=5, accumulation=2, ranks=SINGLE, device=CPU)
    prefetcher.take()  # batches 1 and 2; the next step fails on its first batch, on the thread
    with pytest.raises(ValueError, match="a corrupt row"):
        prefetcher.take()
    prefetcher.close()
    assert prefetcher_threads() == [] and failing.index == 2


class Inline:
    """A run without prefetching: each step's batches prepared on the loop's own thread when the step takes them."""

    def __init__(self, stream: BatchStream, steps: int, accumulation: int, ranks: Ranks, device: torch.device) -> None:
        self.prepare = partial(next_step, stream, accumulation, ranks, device)

    def take(self) -> StepBatches:
        return self.prepare()

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclasses.dataclass
class Trained:
    state: T.TrainState
    weights: dict[str, torch.Tensor]
    batches: list[Batch]  # as train_step received them
    threads: set[str]  # the threads that read the stream


TRAIN_STEP = T.train_step


def tiny(tmp_path: Path) -> R.Run:
    """12 steps of two micro-batches each, checkpoints every 4."""
    run = tiny_run(tmp_path, 12, log_every=4, checkpoint_every=4, compile=False)
    return dataclasses.replace(run, settings=dataclasses.replace(run.settings, accumulation=2))


def train(run: R.Run, monkeypatch: pytest.MonkeyPatch, stop_at: int | None = None) -> Trained:
    """The run trained (dropout on), resumed from its checkpoint if it has one; with `stop_at`, Ctrl-C arrives in
    the middle of that step."""
    seen, threads, data = [], set(), stream()
    next_batch = data.next

    def next_noting_the_thread() -> Batch:
        threads.add(threading.current_thread().name)
        return next_batch()

    def noted_step(*args, **kwargs):
        seen.extend(args[3])
        if stop_at is not None and len(seen) == 2 * stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C inside the step: it finishes, is checkpointed, the run stops
        return TRAIN_STEP(*args, **kwargs)

    data.next = next_noting_the_thread
    monkeypatch.setattr(T, "train_step", noted_step)
    torch.manual_seed(0)
    model = Transformer(DROPOUT)
    with stopping.graceful_stops():
        state = T.train(model, run, data, (PAIRS[0][:4], PAIRS[1][:4]), CPU)
    return Trained(state, model.state_dict(), seen, threads)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Trained:
    with pytest.MonkeyPatch.context() as monkeypatch:
        return train(tiny(tmp_path_factory.mktemp("whole")), monkeypatch)


def test_a_run_trains_on_the_same_batches_to_the_same_weights_with_and_without_prefetching(
    tmp_path, monkeypatch, uninterrupted
):
    monkeypatch.setattr(T, "Prefetcher", Inline)
    inline = train(tiny(tmp_path), monkeypatch)
    plain = stream()
    assert_same_batches(uninterrupted.batches, [plain.next() for _ in range(24)])
    assert_same_batches(inline.batches, uninterrupted.batches)
    assert different_weights(inline.weights, uninterrupted.weights) == []
    times = ("wall_s", "steady_s")
    assert dataclasses.replace(uninterrupted.state, **dict.fromkeys(times, 0.0)) == dataclasses.replace(
        inline.state, **dict.fromkeys(times, 0.0)
    )
    assert (uninterrupted.state.epoch, uninterrupted.state.index) == (plain.epoch, plain.index)
    assert plain.epoch == 1  # into the second epoch
    assert uninterrupted.threads == {"prefetch_0"} and inline.threads == {threading.main_thread().name}
    assert prefetcher_threads() == []


def test_a_run_stopped_mid_step_checkpoints_the_batches_it_trained_on_and_resumes_to_the_same_weights(
    tmp_path, monkeypatch, uninterrupted
):
    run = tiny(tmp_path)
    with pytest.raises(stopping.Stopped):
        train(run, monkeypatch, stop_at=5)  # the thread has prepared step 6 by then
    assert prefetcher_threads() == []
    saved = C.read_checkpoint(run.directory / R.CHECKPOINT)
    plain = stream()
    for _ in range(10):
        plain.next()
    assert (saved["state"]["step"], saved["state"]["epoch"], saved["state"]["index"]) == (5, plain.epoch, plain.index)
    resumed = train(run, monkeypatch)
    assert_same_batches(resumed.batches, uninterrupted.batches[10:])
    assert different_weights(resumed.weights, uninterrupted.weights) == []


@needs_cuda
def test_on_a_gpu_the_batches_arrive_on_the_current_device_with_the_values_of_the_host_ones():
    prefetcher = Prefetcher(stream(), steps=3, accumulation=2, ranks=SINGLE, device=torch.device("cuda"))
    steps = [prefetcher.take() for _ in range(3)]
    prefetcher.close()
    plain = stream()
    for step in steps:
        assert all(
            t.device == torch.device("cuda", torch.cuda.current_device()) for b in step.batches for t in tensors(b)
        )
        assert_same_batches([b.to(CPU) for b in step.batches], [plain.next() for _ in range(2)])
