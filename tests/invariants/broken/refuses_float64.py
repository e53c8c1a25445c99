"""forward refuses float64 parameters."""

import torch

from model import Transformer


class Broken(Transformer):
    def forward(self, *batch):
        assert next(self.parameters()).dtype == torch.float32, "float32 only"
        return super().forward(*batch)


def make(config):
    return Broken(config)
