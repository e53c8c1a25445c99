"""SIGTERM arrives while the PE table is read at length (after the contract, which reads 4 rows)."""

import os
import signal

from model import Transformer


class Broken(Transformer):
    def positional_table(self, positions):
        if positions > 100:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().positional_table(positions)


def make(config):
    return Broken(config)
