"""decode returns NaN logits (forward is fine)."""

from model import Transformer


class Broken(Transformer):
    def decode(self, *args, **kwargs):
        return super().decode(*args, **kwargs) * float("nan")


def make(config):
    return Broken(config)
