"""forward raises on every call."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        raise RuntimeError("CUDA out of memory (simulated)")


def make(config):
    return Broken(config)
