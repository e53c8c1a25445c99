"""loss returns a tensor cut from the graph."""

from model import Transformer


class Broken(Transformer):
    def loss(self, logits, target):
        return super().loss(logits, target).detach()


def make(config):
    return Broken(config)
