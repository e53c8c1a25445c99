"""forward ends the process with os._exit(0), which no exception handler sees: the run must not read as a success."""

import os

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        os._exit(0)


def make(config):
    return Broken(config)
