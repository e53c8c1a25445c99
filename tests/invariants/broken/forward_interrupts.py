"""forward raises KeyboardInterrupt itself (nobody pressed Ctrl-C): that property's error, not a stop."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        raise KeyboardInterrupt


def make(config):
    return Broken(config)
