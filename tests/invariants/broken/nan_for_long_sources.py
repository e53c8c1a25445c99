"""logits are NaN when the source is longer than 4 tokens (the contract's batch has 3)."""

from model import Transformer


class Broken(Transformer):
    def forward(self, src, tgt, src_pad, tgt_pad):
        logits = super().forward(src, tgt, src_pad, tgt_pad)
        return logits * float("nan") if src.shape[1] > 4 else logits


def make(config):
    return Broken(config)
