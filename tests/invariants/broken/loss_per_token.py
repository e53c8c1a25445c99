"""loss returns one value per token (no reduction)."""

from model import Transformer


class Broken(Transformer):
    def loss(self, logits, target):
        return logits.logsumexp(-1) - logits.gather(-1, target[..., None])[..., 0]


def make(config):
    return Broken(config)
