"""loss raises on every call."""

from model import Transformer


class Broken(Transformer):
    def loss(self, logits, target):
        raise RuntimeError("loss is computed by the trainer")


def make(config):
    return Broken(config)
