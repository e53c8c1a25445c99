"""forward returns the argmax token ids instead of logits."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        return super().forward(*batch).argmax(-1)


def make(config):
    return Broken(config)
