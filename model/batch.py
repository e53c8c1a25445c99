"""A batch as a seq2seq model reads it: padded source and target ids with their pad masks."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Callable

import torch
from torch import Tensor

from model.protocol import Seq2SeqModel


@dataclass(frozen=True)
class Batch:
    """Padded ids and their masks (True at padding). For training and scoring, `labels` holds the token each
    target position predicts (teacher forcing: tgt is BOS + y, labels y + EOS); synthetic batches have none.

    A packed batch holds several pairs per row, their sources one after another in the source row and their targets
    in the same order in the target row: `src_segments` and `tgt_segments` number a row's pairs 1..k (0 at padding).
    None: one pair per row."""

    src: Tensor  # (B, S) ids
    tgt: Tensor  # (B, T) the decoder's input
    src_pad: Tensor  # (B, S) bool
    tgt_pad: Tensor  # (B, T) bool
    labels: Tensor | None = None  # (B, T) ids
    src_segments: Tensor | None = None  # (B, S) long, packed batches only
    tgt_segments: Tensor | None = None  # (B, T) long, packed batches only
    # (source, target) non-pad tokens, counted where the masks are (the CPU) and carried by `to`: counting them on a
    # GPU would make the host wait for it between the forward and the backward pass of a training step.
    counts: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    right_padded: bool = False  # every row's padding follows its tokens (the runner's batches); unknown if False

    @cached_property  # read several times a training step: counted once per batch
    def src_tokens(self) -> int:
        return self.counts[0] if self.counts else int(self.src_pad.numel() - self.src_pad.sum())

    @cached_property
    def tgt_tokens(self) -> int:
        return self.counts[1] if self.counts else int(self.tgt_pad.numel() - self.tgt_pad.sum())

    @property
    def packed(self) -> bool:
        return self.src_segments is not None

    def forward(self, model: Seq2SeqModel, with_labels: bool = False) -> Tensor:
        """The model's logits (B, T, vocab) for this batch; `with_labels`, the loss of a model that takes the labels
        and returns its training loss (the reference model, `Transformer.training_loss`). A packed batch's segments
        go to the model as `segments=(src_segments, tgt_segments)`; an unpacked batch calls it without them."""
        packed = {"segments": (self.src_segments, self.tgt_segments)} if self.packed else {}
        if with_labels:
            return model(
                self.src,
                self.tgt,
                self.src_pad,
                self.tgt_pad,
                labels=self.labels,
                right_padded=self.right_padded,
                **packed,
            )
        return model(self.src, self.tgt, self.src_pad, self.tgt_pad, **packed)

    def map(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        """The batch with `fn` applied to every tensor it holds, its token counts taken along (counted here, before
        `fn`, if not yet): the one place that lists the fields, so that moving or pinning a batch drops none."""
        moved = {f.name: fn(getattr(self, f.name)) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}
        return replace(self, **moved, counts=(self.src_tokens, self.tgt_tokens))

    def to(self, device: torch.device) -> Batch:
        """The batch on `device`, its token counts taken along."""
        return self.map(lambda t: t.to(device, non_blocking=True))
