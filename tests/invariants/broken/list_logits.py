"""forward returns a list of per-sentence logits."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        return list(super().forward(*batch))


def make(config):
    return Broken(config)
