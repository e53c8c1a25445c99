"""The packed stream (several pairs per row, ablations/data/batching.py): every pair once an epoch, in batches within
their token budget, resumable and deterministic as the unpacked stream is; the budgets that pack, and the models
that cannot be trained packed."""

import pytest
import torch

import invariants.mutants  # noqa: F401  (registers mutant:NAME, as the runner does)
from ablations.data.batching import BatchStream
from ablations.data.bpe import BOS, EOS
from ablations.runs import options
from ablations.runs.budgets import budget, select_rows, settings_for
from ablations.runs.options import failed
from ablations.training.prefetch import pinned
from model.batch import Batch
from model.registry import parse_spec
from tests.ablations.test_gpu_path import varied_pairs


def pairs_of(batch: Batch) -> list[tuple[list[int], list[int]]]:
    """The (source, bare target) pairs a packed batch holds, read back from its segments."""
    found = []
    for r in range(batch.src.size(0)):
        for j in range(1, int(batch.src_segments[r].max()) + 1):
            labels = batch.labels[r][batch.tgt_segments[r] == j].tolist()
            found.append((batch.src[r][batch.src_segments[r] == j].tolist(), labels[:-1]))
    return found


def same(a: Batch, b: Batch) -> bool:
    fields = ("src", "tgt", "labels", "src_segments", "tgt_segments")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)


def epoch(stream: BatchStream) -> list[Batch]:
    """The stream's batches up to the end of its epoch."""
    batches, start = [], stream.epoch
    while stream.epoch == start:
        batches.append(stream.next())
        if stream.index == len(stream._batches):
            break
    return batches


def test_a_packed_stream_gives_every_pair_once_an_epoch_in_batches_within_max_tokens_per_side():
    src, tgt = varied_pairs(300)
    for _ in range(2):
        batches = epoch(stream := BatchStream(src, tgt, max_tokens=200, seed=1, pad_multiple=8, pack=True))
        assert sorted(p for b in batches for p in pairs_of(b)) == sorted(zip(src, tgt))
        assert all(b.src.numel() <= 200 and b.tgt.numel() <= 200 for b in batches)
        assert all(b.src.size(1) % 8 == 0 and b.tgt.size(1) % 8 == 0 for b in batches)
        assert any(b.src_segments.max() > 1 for b in batches)
        stream.seek(1, 0)


def test_each_pair_of_a_packed_row_is_teacher_forced_and_its_padding_is_segment_0():
    src, tgt = varied_pairs(40)
    batch = BatchStream(src, tgt, max_tokens=200, seed=1, pack=True).next()
    for r in range(batch.tgt.size(0)):
        for j in range(1, int(batch.tgt_segments[r].max()) + 1):
            read, labels = batch.tgt[r][batch.tgt_segments[r] == j], batch.labels[r][batch.tgt_segments[r] == j]
            assert read[0] == BOS and labels[-1] == EOS and torch.equal(read[1:], labels[:-1])
    assert torch.equal(batch.src_pad, batch.src_segments == 0) and torch.equal(batch.tgt_pad, batch.tgt_segments == 0)


def test_a_packed_batch_keeps_its_segments_when_moved_or_pinned(monkeypatch):
    batch = BatchStream(*varied_pairs(40), max_tokens=200, seed=1, pack=True).next()
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: t.clone())  # pinning needs CUDA: a copy stands in
    for moved in (batch.to(torch.device("cpu")), pinned(batch)):
        assert moved.packed and same(moved, batch)
        assert (moved.src_tokens, moved.tgt_tokens) == (batch.src_tokens, batch.tgt_tokens)


def test_a_packed_stream_resumes_from_its_position_and_is_the_same_per_seed_and_epoch():
    src, tgt = varied_pairs(300)
    stream = BatchStream(src, tgt, max_tokens=200, seed=3, pad_multiple=8, pack=True)
    for _ in range(len(stream._batches) + 2):  # into the second epoch
        stream.next()
    position = stream.position
    ahead = [stream.next() for _ in range(3)]
    resumed = BatchStream(src, tgt, max_tokens=200, seed=3, pad_multiple=8, pack=True)
    resumed.seek(**position)
    for batch, again in zip(ahead, (resumed.next() for _ in range(3))):
        assert same(batch, again)
    other = BatchStream(src, tgt, max_tokens=200, seed=4, pad_multiple=8, pack=True)
    assert not same(other.next(), BatchStream(src, tgt, max_tokens=200, seed=3, pad_multiple=8, pack=True).next())


def test_packing_short_pairs_wastes_a_fraction_of_the_positions_one_pair_per_row_wastes_at_multiple_8():
    g = torch.Generator().manual_seed(0)
    src, tgt = ([[5] * n + [EOS] for n in torch.randint(1, 12, (400,), generator=g).tolist()] for _ in range(2))
    src[0] = [5] * 39 + [EOS]  # one long pair sets the row length (40 + BOS: 48 positions)
    padding = {}
    for pack in (False, True):
        batches = epoch(BatchStream(src, tgt, max_tokens=480, seed=1, pad_multiple=8, pack=pack))
        real = sum(b.src_tokens + b.tgt_tokens for b in batches)
        padding[pack] = 1 - real / sum(b.src.numel() + b.tgt.numel() for b in batches)
    assert padding[True] < padding[False] / 3


def test_short_and_paper_pack_on_a_gpu_only_and_a_cpu_runs_record_is_unchanged():
    base = select_rows("base")[0]
    for name in ("short", "paper"):
        assert settings_for(base, budget(name), torch.device("cuda")).pack
        assert not settings_for(base, budget(name), torch.device("cpu")).pack
    cpu = settings_for(base, budget("cpu"), torch.device("cpu"))
    assert "pack" not in cpu.to_dict() and settings_for(base, budget("short"), torch.device("cuda")).to_dict()["pack"]


@pytest.mark.parametrize("spec", ["torch-nn", "mutant:decoder_without_pe"])
def test_a_model_that_takes_no_segments_is_refused_packed_in_one_line_naming_the_fix(spec, capsys):
    smoke = budget("smoke")
    options.check_model(parse_spec(spec), smoke, "multi30k")  # one pair per row: fine
    with pytest.raises(ValueError) as refused:
        options.check_model(parse_spec(spec), smoke, "multi30k", packed=True)
    assert failed(refused.value) == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "--no-pack" in message and "takes_segments" in message
