"""Ctrl-C arrives while the PE table is read at length (after the contract, which reads 4 rows)."""

from model import Transformer


class Broken(Transformer):
    def positional_table(self, positions):
        if positions > 100:
            raise KeyboardInterrupt
        return super().positional_table(positions)


def make(config):
    return Broken(config)
