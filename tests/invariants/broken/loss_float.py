"""loss returns a Python float."""

from model import Transformer


class Broken(Transformer):
    def loss(self, logits, target):
        return super().loss(logits, target).item()


def make(config):
    return Broken(config)
