"""forward returns (B, vocab, T), the layout cross_entropy takes."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        return super().forward(*batch).transpose(1, 2)


def make(config):
    return Broken(config)
