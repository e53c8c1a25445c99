"""Token-count batches with length bucketing, and a resumable stream of them.

As in the paper (section 5.1), sentence pairs are batched by approximate length so that each batch
holds about `max_tokens` source and `max_tokens` target positions, padding included. The order of
batches is a function of (seed, epoch) alone, so a stream's position is two integers.
On a GPU each side's length is padded up to a multiple of `pad_multiple` (8): a compiled model and the attention
kernels then meet a few shapes, not one per batch; the rows per batch are chosen from the padded lengths.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from ablations.data.bpe import BOS, EOS, PAD
from model.batch import Batch


def round_up(length: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that holds `length` positions."""
    return -(-length // multiple) * multiple


def _pad(rows: list[list[int]], multiple: int = 1) -> Tensor:
    out = torch.full((len(rows), round_up(max(map(len, rows)), multiple)), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def make_batch(src: list[list[int]], tgt: list[list[int]], pad_multiple: int = 1) -> Batch:
    """A teacher-forcing batch from source ids (already ending in EOS) and bare target ids: the decoder reads
    BOS + y and predicts y + EOS. Each side is padded to a multiple of `pad_multiple` positions."""
    s = _pad(src, pad_multiple)
    t_in, labels = _pad([[BOS] + t for t in tgt], pad_multiple), _pad([t + [EOS] for t in tgt], pad_multiple)
    return Batch(s, t_in, s.eq(PAD), labels.eq(PAD), labels, right_padded=True)


def bucketed_batches(
    src_lens: list[int], tgt_lens: list[int], max_tokens: int, seed: int, epoch: int, pad_multiple: int = 1
) -> list[list[int]]:
    """Indices grouped into batches of similar length with at most max_tokens padded positions per side
    (a single longer pair makes a batch of its own); the batch order is shuffled by (seed, epoch)."""
    if pad_multiple > 1:  # lengths as padded: pairs of one padded length fill batches of one shape
        src_lens = [round_up(n, pad_multiple) for n in src_lens]
        tgt_lens = [round_up(n + 1, pad_multiple) - 1 for n in tgt_lens]
    rng = random.Random(seed * 1_000_003 + epoch)
    noise = [rng.random() for _ in src_lens]
    order = sorted(range(len(src_lens)), key=lambda i: (src_lens[i], tgt_lens[i], noise[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    for i in order:
        s, t = max(longest_src, src_lens[i]), max(longest_tgt, tgt_lens[i] + 1)  # + 1: BOS / EOS
        if current and (s * (len(current) + 1) > max_tokens or t * (len(current) + 1) > max_tokens):
            batches.append(current)
            current, s, t = [], src_lens[i], tgt_lens[i] + 1
        current.append(i)
        longest_src, longest_tgt = s, t
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


class BatchStream:
    """An endless stream of training batches, epoch after epoch; `position` is all it needs to resume."""

    def __init__(
        self,
        src: list[list[int]],
        tgt: list[list[int]],
        max_tokens: int,
        seed: int,
        epoch: int = 0,
        index: int = 0,
        pad_multiple: int = 1,
    ) -> None:
        self.src, self.tgt, self.max_tokens, self.seed, self.pad_multiple = src, tgt, max_tokens, seed, pad_multiple
        self.src_lens, self.tgt_lens = [len(x) for x in src], [len(y) for y in tgt]
        self.epoch, self.index = epoch, index
        self._batches = self._epoch_batches()

    def _epoch_batches(self) -> list[list[int]]:
        return bucketed_batches(self.src_lens, self.tgt_lens, self.max_tokens, self.seed, self.epoch, self.pad_multiple)

    def seek(self, epoch: int, index: int) -> None:
        """Continue from a saved position: batch `index` of epoch `epoch`."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._batches = self._epoch_batches()
        self.index = index

    @property
    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def next(self) -> Batch:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self._epoch_batches()
        chosen = self._batches[self.index]
        self.index += 1
        return make_batch([self.src[i] for i in chosen], [self.tgt[i] for i in chosen], self.pad_multiple)
