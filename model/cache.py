"""The decoder's cache for incremental decoding: keys and values of the steps decoded so far (self-attention) and of
the memory (cross-attention), grown in place, and reordered in place when beam search keeps other hypotheses."""

from __future__ import annotations

import torch
from torch import Tensor

from model import kernels


class KVCache:
    """Keys and values of earlier decoder steps (self-attention) and of the memory (cross-attention).

    Self-attention entries live in buffers that double when full, so that a step writes only its new position
    (no concatenation of the whole past); `kv` holds their filled part, and `reorder` rewrites only the rows whose
    hypothesis changed. Beam search may pass the memory once per sentence for all of its `beams` decoder rows: those
    cross-attention entries then have one row per sentence, are shared by its beams, and `reorder` leaves them as they are.
    """

    def __init__(self, beams: int = 1) -> None:
        self.kv: dict[str, tuple[Tensor, Tensor]] = {}
        self.length = 0  # target positions already decoded
        self.beams = beams  # decoder rows per memory row
        self._buffers: dict[str, tuple[Tensor, Tensor]] = {}  # self-attention storage that kv views

    def append(self, name: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new self-attention positions (B, h, T, d) to entry `name`; returns every position so far."""
        past = self.kv.get(name)
        if k.requires_grad:  # decoding under autograd: buffers written in place would break the backward pass
            self.kv[name] = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
            return self.kv[name]
        filled = past[0].size(2) if past is not None else 0
        needed = filled + k.size(2)
        buffers = self._buffers.get(name)
        if buffers is None or buffers[0].size(2) < needed:
            buffers = tuple(x.new_empty(*x.shape[:2], max(2 * needed, 16), x.size(3)) for x in (k, v))
            if past is not None:
                for new, old in zip(buffers, past):
                    new[:, :, :filled].copy_(old)
            self._buffers[name] = buffers
        for buffer, x in zip(buffers, (k, v)):
            buffer[:, :, filled:needed].copy_(x)
        self.kv[name] = (buffers[0][:, :, :needed], buffers[1][:, :, :needed])
        return self.kv[name]

    def reorder(self, index: Tensor) -> None:
        """Keep decoder rows `index` (beam search drops and duplicates hypotheses, within each sentence).

        When the number of rows stays, self-attention rows that keep their own hypothesis stay where they are and only
        the others are copied, which saves most of the copying of the whole past that a full reorder does at every step.
        """
        moved = index.ne(torch.arange(index.numel(), device=index.device)).nonzero().squeeze(1)
        in_place: list[str] = []  # self-attention entries whose moved rows are rewritten in their buffers
        for name, (k, v) in list(self.kv.items()):
            if name not in self._buffers:
                if self.beams == 1 or not name.startswith("cross"):  # not a memory shared by each sentence's beams
                    self.kv[name] = (k.index_select(0, index), v.index_select(0, index))
            elif index.numel() != k.size(0):  # rows dropped or added: gather new buffers
                self._buffers[name] = tuple(b.index_select(0, index) for b in self._buffers[name])
                self.kv[name] = tuple(b[:, :, : k.size(2)] for b in self._buffers[name])
            elif moved.numel():
                in_place.append(name)
        if in_place:
            self.rewrite_rows(in_place, index, moved)

    def rewrite_rows(self, names: list[str], index: Tensor, moved: Tensor) -> None:
        """The moved rows of these entries' buffers take their source rows' filled positions, in place: by the kernel
        (model/kernels/: each row copied once, all entries in one call), else by `rewrite_rows_with_torch_ops`."""
        if not kernels.reorder_rows([b for n in names for b in self._buffers[n]], index, self.kv[names[0]][0].size(2)):
            self.rewrite_rows_with_torch_ops(names, index, moved)

    def rewrite_rows_with_torch_ops(self, names: list[str], index: Tensor, moved: Tensor) -> None:
        """What `rewrite_rows` does, by torch ops: the moved rows' sources gathered into a new tensor, then written back."""
        sources = index.index_select(0, moved)
        for name in names:
            for x in self.kv[name]:  # views of the buffers: the rows are gathered first, then written in place
                x.index_copy_(0, moved, x.index_select(0, sources))
