"""The decoder's cache for incremental decoding: keys and values of the steps decoded so far (self-attention) and of
the memory (cross-attention), grown in place, and reordered when beam search keeps other hypotheses."""

from __future__ import annotations

import torch
from torch import Tensor

from model import kernels


class KVCache:
    """Keys and values of earlier decoder steps (self-attention) and of the memory (cross-attention).

    Self-attention entries live in buffers that a step writes only its new positions into (no concatenation of the
    whole past); `kv` holds their filled part. A decoder that knows its longest output (beam search) `reserve`s that
    many positions, and the buffers never grow; otherwise they double when full. Beam search may pass the memory once
    per sentence for all of its `beams` decoder rows: those cross-attention entries then have one row per sentence, are
    shared by its beams, and `reorder` leaves them as they are. Nothing here reads a tensor's value on the host.
    After `fix_shapes`, every step has the same shapes and writes to the same memory (a CUDA graph's replays).
    """

    def __init__(self, beams: int = 1) -> None:
        self.kv: dict[str, tuple[Tensor, Tensor]] = {}
        self.length = 0  # target positions already decoded
        self.beams = beams  # decoder rows per memory row
        self.capacity = 0  # positions the first append allocates, at least (`reserve`)
        self._buffers: dict[str, tuple[Tensor, Tensor]] = {}  # self-attention storage that kv views
        self._spare: dict[str, tuple[Tensor, Tensor]] = {}  # what `gather_rows` writes into, then swaps in
        self.position: Tensor | None = None  # fixed shapes: the step's first position, on the device (`fix_shapes`)

    def reserve(self, positions: int) -> None:
        """Make the self-attention buffers hold `positions` target positions from the start: no growing, no copying."""
        self.capacity = max(self.capacity, positions)

    def fix_shapes(self, device: torch.device) -> None:
        """Decode at fixed shapes from here on, so that a step can be captured and replayed as a CUDA graph: the
        self-attention buffers hold every `reserve`d position from the first step, each step writes its keys and
        values at `position` (which the caller sets before the step) and attends to all of them, the model masking
        those after its own (`Transformer.decoded`), and `reorder` rewrites rows in place."""
        if self.capacity < 1:
            raise ValueError("fixed shapes need the positions reserved first (KVCache.reserve)")
        self.position = torch.zeros(1, dtype=torch.long, device=device)

    def positions(self, count: int) -> Tensor:
        """The positions of a fixed-shape step's `count` new target tokens, on the device."""
        assert self.position is not None, "fix_shapes first"
        return self.position + torch.arange(count, device=self.position.device)

    def append(self, name: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new self-attention positions (B, h, T, d) to entry `name`; returns every position so far (at fixed
        shapes, every reserved position)."""
        if self.position is not None:
            return self._write(name, k, v)
        past = self.kv.get(name)
        if k.requires_grad:  # decoding under autograd: buffers written in place would break the backward pass
            self.kv[name] = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
            return self.kv[name]
        filled = past[0].size(2) if past is not None else 0
        needed = filled + k.size(2)
        buffers = self._buffers.get(name)
        if buffers is None or buffers[0].size(2) < needed:
            size = self.capacity if needed <= self.capacity else max(2 * needed, 16)
            buffers = tuple(x.new_empty(*x.shape[:2], size, x.size(3)) for x in (k, v))
            if past is not None:
                for new, old in zip(buffers, past):
                    new[:, :, :filled].copy_(old)
            self._buffers[name] = buffers
        for buffer, x in zip(buffers, (k, v)):
            buffer[:, :, filled:needed].copy_(x)
        self.kv[name] = (buffers[0][:, :, :needed], buffers[1][:, :, :needed])
        return self.kv[name]

    def _write(self, name: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """`append` at fixed shapes: k and v written into the whole reserved buffers at this step's positions."""
        buffers = self._buffers.get(name)
        if buffers is None:  # zeros: a masked key's value is multiplied by 0, and 0 x nan would be nan
            buffers = tuple(x.new_zeros(*x.shape[:2], self.capacity, x.size(3)) for x in (k, v))
            self._buffers[name] = self.kv[name] = buffers
        at = self.positions(k.size(2))
        for buffer, x in zip(buffers, (k, v)):
            buffer.index_copy_(2, at, x)
        return buffers

    def reorder(self, index: Tensor) -> None:
        """Keep decoder rows `index` (beam search drops and duplicates hypotheses, within each sentence)."""
        if self.position is not None:  # fixed shapes: in place, every row copied (as `gather_rows` does)
            for name, pair in self.kv.items():
                if self.beams == 1 or not name.startswith("cross"):
                    for x in pair:
                        x.copy_(x.index_select(0, index))
            return
        same_rows: list[str] = []  # self-attention entries whose buffers keep their number of rows
        for name, (k, v) in list(self.kv.items()):
            if name not in self._buffers:
                if self.beams == 1 or not name.startswith("cross"):  # not a memory shared by each sentence's beams
                    self.kv[name] = (k.index_select(0, index), v.index_select(0, index))
            elif index.numel() != k.size(0):  # rows dropped or added: gather new buffers
                self._buffers[name] = tuple(b.index_select(0, index) for b in self._buffers[name])
                self._spare.pop(name, None)
                self.kv[name] = tuple(b[:, :, : k.size(2)] for b in self._buffers[name])
            else:
                same_rows.append(name)
        if same_rows:
            self.rewrite_rows(same_rows, index)

    def rewrite_rows(self, names: list[str], index: Tensor) -> None:
        """Row r of these entries takes row index[r]'s filled positions: on the CPU by the kernel (model/kernels/: in
        place, only moved rows copied, all entries in one call), else by `gather_rows` (a GPU's path: no host sync)."""
        if not kernels.reorder_rows([b for n in names for b in self._buffers[n]], index, self.kv[names[0]][0].size(2)):
            self.gather_rows(names, index)

    def gather_rows(self, names: list[str], index: Tensor) -> None:
        """What `rewrite_rows` does, by one index_select per tensor into spare buffers that then swap with the
        buffers. Every row is copied, moved or not: finding the moved ones (nonzero) would make the host wait."""
        for name in names:
            buffers, spare = self._buffers[name], self._spare.get(name)
            if spare is None or spare[0].shape != buffers[0].shape:
                spare = tuple(torch.empty_like(b) for b in buffers)
            filled = self.kv[name][0].size(2)
            for old, new in zip(self.kv[name], spare):
                torch.index_select(old, 0, index, out=new[:, :, :filled])
            self._buffers[name], self._spare[name] = spare, buffers
            self.kv[name] = (spare[0][:, :, :filled], spare[1][:, :, :filled])

    def rewrite_rows_with_torch_ops(self, names: list[str], index: Tensor) -> None:
        """What `rewrite_rows` does, as before the kernel: the moved rows found (nonzero, a host sync on a GPU), their
        sources gathered into a new tensor, then written back in place."""
        moved = index.ne(torch.arange(index.numel(), device=index.device)).nonzero().squeeze(1)
        sources = index.index_select(0, moved)
        for name in names:
            for x in self.kv[name]:  # views of the buffers: the rows are gathered first, then written in place
                x.index_copy_(0, moved, x.index_select(0, sources))
