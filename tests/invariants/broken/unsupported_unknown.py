"""unsupported names a capability that does not exist (a typo)."""

from model import Transformer


class Broken(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.unsupported = {"kv-cache": "no cache"}


def make(config):
    return Broken(config)
