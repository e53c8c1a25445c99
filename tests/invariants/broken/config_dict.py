"""config is a plain dict, not the TransformerConfig."""

from model import Transformer


class Broken(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.config = config.to_dict()


def make(config):
    return Broken(config)
