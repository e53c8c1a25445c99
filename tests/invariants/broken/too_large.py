"""A model too large for memory: the weights need 80 TB (built fine on the meta device, where nothing is allocated)."""

import torch

from model import Transformer


class Broken(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.huge = torch.nn.Parameter(torch.empty(10**13, dtype=torch.uint8), requires_grad=False)


def make(config):
    return Broken(config)
