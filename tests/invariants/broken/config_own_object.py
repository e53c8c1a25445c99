"""config is an object of the adapter's own."""

from types import SimpleNamespace

from model import Transformer


class Broken(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.config = SimpleNamespace(**config.to_dict())


def make(config):
    return Broken(config)
