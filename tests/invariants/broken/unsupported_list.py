"""unsupported is a list of names, not a mapping name -> reason."""

from model import Transformer


class Broken(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.unsupported = ["kv_cache"]


def make(config):
    return Broken(config)
