"""forward calls sys.exit(0), as a script's code copied into a model might: the run must not end with exit 0."""

import sys

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        sys.exit(0)


def make(config):
    return Broken(config)
