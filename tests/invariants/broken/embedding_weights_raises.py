"""embedding_weights raises KeyError."""

from model import Transformer


class Broken(Transformer):
    def embedding_weights(self):
        raise KeyError("generator")


def make(config):
    return Broken(config)
