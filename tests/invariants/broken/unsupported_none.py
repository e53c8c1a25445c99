"""unsupported = None."""

from model import Transformer


class Broken(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.unsupported = None


def make(config):
    return Broken(config)
