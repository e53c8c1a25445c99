"""forward raises NotImplementedError (only encode/decode written)."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        raise NotImplementedError


def make(config):
    return Broken(config)
