"""The host never waits for the device inside a training step, and the loop waits only at logging and checkpoint steps;
nor inside a beam-search step.

On a GPU, reading a tensor's value on the host (item(), int(), bool(), float(), tolist(), indexing with it) waits for
every kernel queued before it. Here such reads are counted on every tensor, in Python, on the CPU: reads that torch
makes inside its own C++ code are not seen, which is what torch.cuda.set_sync_debug_mode checks where CUDA is there.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import pytest
import torch

from ablations.data.batching import BatchStream, make_batch
from ablations.data.bpe import EOS, PAD
from ablations.scoring import decoding
from ablations.training import train as T
from ablations.runs.budgets import step_autocast
from ablations.training.precision import for_training
from model import Transformer, TransformerConfig, kernels
from model.batch import Batch
from tests.ablations.test_gpu_path import attention_as_on_a_gpu, tiny_run, varied_pairs
from tests.helpers import needs_cuda

TINY = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=30, max_len=64, P_drop=0.1)
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


class Reads(list):
    """The names of the value reads made on any tensor, in order; none while `paused`."""

    paused = False

    @contextmanager
    def pause(self) -> Iterator[None]:
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


@contextmanager
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """The value reads made on any tensor while inside."""
    reads = Reads()

    def counting(name: str):
        read = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            if not reads.paused:
                reads.append(name)
            return read(self, *args, **kwargs)

        return counted

    with monkeypatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, counting(name))
        yield reads


@pytest.fixture
def gpu_like_attention(monkeypatch):
    """Attention as on a GPU: the CPU's explicit path asks the mask whether any key is masked (a read)."""
    attention_as_on_a_gpu(monkeypatch)


def micro_batches(device: torch.device) -> list[Batch]:
    src, tgt = varied_pairs(8)
    return [make_batch(src[:4], tgt[:4]).to(device), make_batch(src[4:], tgt[4:]).to(device)]


@pytest.mark.parametrize("precision", ["fp32", "bf16-weights"])  # bf16-weights: a bf16 copy steps fp32 master weights
def test_a_training_step_reads_no_tensor_back_and_its_loss_only_when_the_caller_asks(
    precision, monkeypatch, gpu_like_attention
):
    torch.manual_seed(0)
    model = Transformer(TINY)
    forward, optimizer = for_training(model, T.make_optimizer(model, torch.device("cpu")), precision)
    batches = micro_batches(torch.device("cpu"))
    with counted_reads(monkeypatch) as reads:
        loss = T.train_step(forward, T.loss_of(model), optimizer, batches, lr=1e-3)
    assert reads == []
    with counted_reads(monkeypatch) as reads:
        assert loss.item() > 0
    assert reads == ["item"]  # the counter sees a read where there is one


def packed_micro_batches(device: torch.device) -> list[Batch]:
    stream = BatchStream(*varied_pairs(40), max_tokens=200, seed=1, pad_multiple=8, pack=True)
    return [stream.next().to(device) for _ in range(2)]


def test_a_packed_training_step_reads_no_tensor_back(monkeypatch, gpu_like_attention):
    torch.manual_seed(0)
    model = Transformer(TINY)
    optimizer = T.make_optimizer(model, torch.device("cpu"))
    batches = packed_micro_batches(torch.device("cpu"))
    assert batches[0].packed
    with counted_reads(monkeypatch) as reads:
        T.train_step(model, T.loss_of(model), optimizer, batches, lr=1e-3)
    assert reads == []


def test_a_batch_moved_to_the_device_carries_its_token_counts_so_counting_them_reads_nothing(monkeypatch):
    src, tgt = varied_pairs(8)
    counted, uncounted = make_batch(src, tgt), make_batch(src, tgt)
    moved = counted.to(torch.device("cpu"))
    with counted_reads(monkeypatch) as reads:
        assert (moved.src_tokens, moved.tgt_tokens) == (counted.src_tokens, counted.tgt_tokens)
    assert reads == []
    bare = Batch(uncounted.src, uncounted.tgt, uncounted.src_pad, uncounted.tgt_pad, uncounted.labels)
    with counted_reads(monkeypatch) as reads:
        assert bare.tgt_tokens == counted.tgt_tokens  # counted from the mask: on a GPU, a wait for it
    assert reads == ["__int__"]


@needs_cuda
@pytest.mark.parametrize("precision", ["bf16", "bf16-weights"])
@pytest.mark.parametrize("packed", [False, True], ids=["one pair per row", "packed"])
def test_a_training_step_on_a_gpu_makes_no_synchronising_call(precision, packed):
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    model = Transformer(TINY).to(cuda)
    forward, optimizer = for_training(model, T.make_optimizer(model, cuda), precision)
    batches = packed_micro_batches(cuda) if packed else micro_batches(cuda)
    autocast = step_autocast(precision)
    T.train_step(forward, T.loss_of(model), optimizer, batches, lr=1e-3, autocast=autocast)  # Adam's state made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = T.train_step(forward, T.loss_of(model), optimizer, batches, lr=1e-3, autocast=autocast)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert loss.item() > 0


def steps_reading_back(monkeypatch: pytest.MonkeyPatch, train: Callable[..., object], stream: BatchStream) -> set[int]:
    """The steps of `train(stream, on_step)` in which a tensor's value was read, besides the stream's own counting of
    its batches' tokens: host memory, where there is no device to wait for."""
    after: dict[int, int] = {}  # the reads made up to the end of each step
    with counted_reads(monkeypatch) as reads:
        next_batch = stream.next

        def counted_on_the_host() -> Batch:
            with reads.pause():
                batch = next_batch()
                batch.src_tokens, batch.tgt_tokens
            return batch

        monkeypatch.setattr(stream, "next", counted_on_the_host)
        train(stream, on_step=lambda step: after.__setitem__(step, len(reads)))
    return {step for step in after if after[step] > after.get(step - 1, 0)}


def test_the_loop_reads_back_only_at_logging_and_checkpoint_steps(tmp_path, monkeypatch, gpu_like_attention):
    run, (src, tgt) = tiny_run(tmp_path, 12, 5, 4, compile=False), varied_pairs(200)

    def train(stream: BatchStream, on_step: Callable[[int], None]) -> None:
        T.train(Transformer(TINY), run, stream, (src[:4], tgt[:4]), torch.device("cpu"), on_step)

    assert steps_reading_back(monkeypatch, train, BatchStream(src, tgt, 120, seed=1)) == {4, 5, 8, 10, 12}


def beam_search_reads(model: Transformer, src: torch.Tensor, reads: Reads) -> list[list[str]]:
    """beam_search's reads between one decoding step's call of model.decode and the next: each step's reads (the last
    step's, made together with the collection of the results, left out), after those before the first step."""
    marks: list[int] = []  # the reads made before each step's decode
    decode = model.decode

    def marked(*args):
        marks.append(len(reads))
        return decode(*args)

    model.decode = marked
    decoding.beam_search(model, src, src.eq(PAD), beam=4, extra_len=20)
    return [reads[: marks[0]]] + [reads[a:b] for a, b in zip(marks, marks[1:])]


def test_a_beam_search_step_reads_nothing_back_but_whether_all_are_done_every_few_steps(
    monkeypatch, gpu_like_attention
):
    monkeypatch.setattr(kernels, "reorder_rows", lambda *args: False)  # the cache's rows gathered, as on a GPU
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    src = torch.randint(4, TINY.vocab_size, (3, 9))
    src[:, -1], src[0, 5:] = EOS, torch.tensor([EOS, PAD, PAD, PAD])  # sources of unequal lengths
    with counted_reads(monkeypatch) as reads:
        before, *steps = beam_search_reads(model, src, reads)
    every = decoding.DONE_CHECK_EVERY
    assert len(steps) > every
    assert before == ["tolist"]  # the source lengths, which size the search
    assert steps == [["__bool__"] if t % every == 0 else [] for t in range(1, len(steps) + 1)]


@needs_cuda
@pytest.mark.parametrize("graph", [False, True], ids=["steps launched", "steps replayed"])
def test_a_beam_search_on_a_gpu_synchronises_only_before_its_first_step_and_after_its_last(graph, monkeypatch):
    # Replayed: capturing the second step waits for the GPU once (torch.cuda.graph), before any replay.
    monkeypatch.setattr(decoding, "DONE_CHECK_EVERY", 10**9)  # no look at the done flags between the steps
    capture, captures = decoding.captured, []

    def capture_waiting(*args):
        torch.cuda.set_sync_debug_mode("default")
        captures.append(capture(*args))
        torch.cuda.set_sync_debug_mode("error")
        return captures[-1]

    monkeypatch.setattr(decoding, "captured", capture_waiting)
    monkeypatch.setattr(decoding, "graphs_apply", lambda device: graph)
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    model = Transformer(TINY).to(cuda).eval()
    src = torch.randint(4, TINY.vocab_size, (3, 9), device=cuda)
    src[:, -1] = EOS
    decode, results = model.decode, decoding.Finished.results

    def strict(*args):
        torch.cuda.set_sync_debug_mode("error")
        return decode(*args)

    def relaxed(finished: decoding.Finished) -> list[list[int]]:
        torch.cuda.set_sync_debug_mode("default")
        return results(finished)

    model.decode = strict
    monkeypatch.setattr(decoding.Finished, "results", relaxed)
    try:
        hyps = decoding.beam_search(model, src, src.eq(PAD), beam=4, extra_len=20)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(hyps) == 3 and len(captures) == (1 if graph else 0) and None not in captures
