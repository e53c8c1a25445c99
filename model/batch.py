"""A batch as a seq2seq model reads it: padded source and target ids with their pad masks."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from model.protocol import Seq2SeqModel


@dataclass(frozen=True)
class Batch:
    """Padded ids and their masks (True at padding). For training and scoring, `labels` holds the token each
    target position predicts (teacher forcing: tgt is BOS + y, labels y + EOS); synthetic batches have none."""

    src: Tensor  # (B, S) ids
    tgt: Tensor  # (B, T) the decoder's input
    src_pad: Tensor  # (B, S) bool
    tgt_pad: Tensor  # (B, T) bool
    labels: Tensor | None = None  # (B, T) ids
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

    def forward(self, model: Seq2SeqModel, with_labels: bool = False) -> Tensor:
        """The model's logits (B, T, vocab) for this batch; `with_labels`, the loss of a model that takes the labels
        and returns its training loss (the reference model, `Transformer.training_loss`)."""
        if with_labels:
            return model(
                self.src, self.tgt, self.src_pad, self.tgt_pad, labels=self.labels, right_padded=self.right_padded
            )
        return model(self.src, self.tgt, self.src_pad, self.tgt_pad)

    def to(self, device: torch.device) -> Batch:
        """The batch on `device`, its token counts taken along (counted here, before the move, if not yet)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(
            move(self.src),
            move(self.tgt),
            move(self.src_pad),
            move(self.tgt_pad),
            move(self.labels),
            (self.src_tokens, self.tgt_tokens),
            self.right_padded,
        )
