"""An object without the protocol's loss member: a front-door error (one line, exit status 2)."""

from torch import nn


class Broken(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.unsupported = config, {}

    def forward(self, src, tgt, src_pad, tgt_pad):
        raise NotImplementedError


def make(config):
    return Broken(config)
