"""The unpadded stream (pad_multiple 1, the CPU budgets) pinned batch for batch, and the padding floor the shapes
report gives beside each multiple's padding."""

import hashlib
import json
import random

from ablations.bench.shapes import padding_floor, stream_shapes
from ablations.data.batching import BatchStream, bucketed_batches, make_batch
from ablations.data.bpe import EOS


def synthetic_corpus(n: int = 300) -> tuple[list[list[int]], list[list[int]]]:
    """n pairs of ids with source lengths 2..41 (EOS included) and target lengths 0..40, from a fixed seed."""
    rng = random.Random(0)
    src = [[rng.randrange(4, 50) for _ in range(rng.randint(1, 40))] + [EOS] for _ in range(n)]
    tgt = [[rng.randrange(4, 50) for _ in range(rng.randint(0, 40))] for _ in range(n)]
    return src, tgt


def test_the_unpadded_batches_and_their_order_are_those_the_committed_runs_trained_on():
    # Committed CPU runs and their run identities depend on this order: a change here must be a deliberate one.
    # The digests were computed with the batching of commit 032c32d.
    src, tgt = synthetic_corpus()
    src_lens, tgt_lens = [len(x) for x in src], [len(y) for y in tgt]
    indices = [bucketed_batches(src_lens, tgt_lens, 150, seed, epoch) for seed in (0, 1) for epoch in (0, 1)]
    assert hashlib.sha256(json.dumps(indices).encode()).hexdigest() == (
        "08d7b29fe6c14cc6da6b08f8f4a2882e188e285d4a720e3703657f6f7d23a6a6"
    )
    stream, digest = BatchStream(src, tgt, 150, seed=1), hashlib.sha256()
    for _ in range(200):  # 76 batches an epoch: three epochs' worth
        batch = stream.next()
        for tensor in (batch.src, batch.tgt, batch.labels):
            digest.update(json.dumps(tensor.tolist()).encode())
    assert digest.hexdigest() == "688e2b1c99c96d2e001967059871590908235db03faafaf4a9695bbeae0cd3d6"


def test_the_padding_floor_is_each_rows_own_lengths_rounded_up_and_no_batch_goes_under_it():
    one = make_batch([[5] * 9 + [EOS]], [[6] * 2], pad_multiple=8)  # 10 source, 3 target positions: 16 and 8 padded
    assert padding_floor([one], 8) == stream_shapes([one])["padding"] == 1 - 13 / 24
    stream = BatchStream(*synthetic_corpus(), 150, seed=1, pad_multiple=8)
    batches = [stream.next() for _ in range(50)]
    assert 0 < padding_floor(batches, 8) <= stream_shapes(batches)["padding"]
    assert padding_floor([make_batch(*synthetic_corpus(20))], 1) == 0  # unpadded: no floor
