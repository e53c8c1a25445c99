"""positional_table returns one row too many."""

from model import Transformer


class Broken(Transformer):
    def positional_table(self, positions):
        return super().positional_table(positions + 1)


def make(config):
    return Broken(config)
