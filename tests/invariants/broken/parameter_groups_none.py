"""parameter_groups returns None."""

from model import Transformer


class Broken(Transformer):
    def parameter_groups(self):
        return None


def make(config):
    return Broken(config)
