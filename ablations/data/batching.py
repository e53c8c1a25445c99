"""Token-count batches with length bucketing, and a resumable stream of them.

As in the paper (section 5.1), sentence pairs are batched by approximate length so that each batch
holds about `max_tokens` source and `max_tokens` target positions, padding included. The order of
batches is a function of (seed, epoch) alone, so a stream's position is two integers.
On a GPU each side's length is padded up to a multiple of `pad_multiple` (8): a compiled model and the attention
kernels then meet a few shapes, not one per batch; the rows per batch are chosen from the padded lengths.

Packed (`pack`, on a GPU), several pairs share a row, so that those lengths waste few positions on padding: a row
holds pairs 1..k, their sources one after another in the source row and their targets in the same order in the target
row (each BOS + y, its labels y + EOS), numbered by segment ids (0 at padding). The model masks each pair's attention
to itself and restarts its positions at each pair (model/transformer.py, `within_pairs`), so each pair is computed as
it would be alone in a row. Per epoch the pairs are shuffled by (seed, epoch) and packed in pools of `POOL` into rows
(`fill_rows`), which are then batched by length as pairs are, so the order is again a function of (seed, epoch).
"""

from __future__ import annotations

import bisect
import random

import torch
from torch import Tensor

from ablations.data.bpe import BOS, EOS, PAD
from model.batch import Batch


def round_up(length: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that holds `length` positions."""
    return -(-length // multiple) * multiple


def pad_rows(rows: list[list[int]], multiple: int = 1, fill: int = PAD) -> Tensor:
    """The rows as one (len(rows), L) tensor, L the longest row rounded up to `multiple`, `fill` after each row."""
    out = torch.full((len(rows), round_up(max(map(len, rows)), multiple)), fill, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def make_batch(src: list[list[int]], tgt: list[list[int]], pad_multiple: int = 1) -> Batch:
    """A teacher-forcing batch from source ids (already ending in EOS) and bare target ids: the decoder reads
    BOS + y and predicts y + EOS. Each side is padded to a multiple of `pad_multiple` positions."""
    s = pad_rows(src, pad_multiple)
    t_in, labels = pad_rows([[BOS] + t for t in tgt], pad_multiple), pad_rows([t + [EOS] for t in tgt], pad_multiple)
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


POOL = 4096  # pairs packed together: enough short pairs to fill the rows' ends


def row_length(src_lens: list[int], tgt_lens: list[int], multiple: int) -> int:
    """The positions of a row per side: the longest pair's (its target with BOS), rounded up to `multiple`."""
    return round_up(max(max(src_lens), max(tgt_lens) + 1), multiple)


def fill_rows(pool: list[int], src_lens: list[int], tgt_lens: list[int], length: int) -> list[list[int]]:
    """The pool's pairs in rows of at most `length` source and target positions each: each row starts with the
    longest pair left, then takes the longest pair whose longer side (the target counted with BOS) fits the row's
    fuller side, until none does. Pairs are sorted by that side, so each is found by bisection."""
    size = {i: max(src_lens[i], tgt_lens[i] + 1) for i in pool}
    left = sorted(pool, key=lambda i: (size[i], i))
    sizes = [size[i] for i in left]
    rows = []
    while left:
        row, free_src, free_tgt = [], length, length
        found = len(left) - 1
        while found >= 0:
            i = left.pop(found)
            sizes.pop(found)
            row.append(i)
            free_src, free_tgt = free_src - src_lens[i], free_tgt - tgt_lens[i] - 1
            found = bisect.bisect_right(sizes, min(free_src, free_tgt)) - 1
        rows.append(row)
    return rows


def packed_batches(
    src_lens: list[int], tgt_lens: list[int], max_tokens: int, seed: int, epoch: int, pad_multiple: int = 1
) -> list[list[list[int]]]:
    """Every pair once, in rows (`fill_rows`) grouped into batches of at most `max_tokens` padded positions per side
    (a row longer than that makes a batch of its own), in an order shuffled by (seed, epoch)."""
    order = list(range(len(src_lens)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    length = row_length(src_lens, tgt_lens, pad_multiple)
    rows = [
        row
        for start in range(0, len(order), POOL)
        for row in fill_rows(order[start : start + POOL], src_lens, tgt_lens, length)
    ]
    row_src = [sum(src_lens[i] for i in row) for row in rows]
    row_tgt = [sum(tgt_lens[i] + 1 for i in row) - 1 for row in rows]  # bucketed_batches adds the one BOS of a pair
    return [
        [rows[r] for r in batch] for batch in bucketed_batches(row_src, row_tgt, max_tokens, seed, epoch, pad_multiple)
    ]


def make_packed_batch(src: list[list[list[int]]], tgt: list[list[list[int]]], pad_multiple: int = 1) -> Batch:
    """A teacher-forcing batch whose row r holds the pairs src[r][j], tgt[r][j] (sources ending in EOS, bare targets)
    as segments j + 1, each side padded to a multiple of `pad_multiple` positions."""

    def joined(rows: list[list[list[int]]]) -> Tensor:
        return pad_rows([sum(row, []) for row in rows], pad_multiple)

    def numbered(rows: list[list[list[int]]]) -> Tensor:
        return pad_rows([[j + 1 for j, ids in enumerate(row) for _ in ids] for row in rows], pad_multiple, fill=0)

    t_in = [[[BOS] + t for t in row] for row in tgt]
    s, labels = joined(src), joined([[t + [EOS] for t in row] for row in tgt])
    return Batch(s, joined(t_in), s.eq(PAD), labels.eq(PAD), labels, numbered(src), numbered(t_in))


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
        pack: bool = False,
    ) -> None:
        self.src, self.tgt, self.max_tokens, self.seed, self.pad_multiple = src, tgt, max_tokens, seed, pad_multiple
        self.pack = pack
        self.src_lens, self.tgt_lens = [len(x) for x in src], [len(y) for y in tgt]
        self.epoch, self.index = epoch, index
        self._batches = self._epoch_batches()

    def _epoch_batches(self) -> list[list[int]] | list[list[list[int]]]:
        """The epoch's batches: lists of pairs, or packed, lists of rows of pairs."""
        batching = packed_batches if self.pack else bucketed_batches
        return batching(self.src_lens, self.tgt_lens, self.max_tokens, self.seed, self.epoch, self.pad_multiple)

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
        if self.pack:
            src = [[self.src[i] for i in row] for row in chosen]
            return make_packed_batch(src, [[self.tgt[i] for i in row] for row in chosen], self.pad_multiple)
        return make_batch([self.src[i] for i in chosen], [self.tgt[i] for i in chosen], self.pad_multiple)
