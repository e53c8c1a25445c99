"""forward returns (logits, None), as some libraries do."""

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        return super().forward(*batch), None


def make(config):
    return Broken(config)
