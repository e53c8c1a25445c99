"""the model refuses to be converted to float64."""

import torch

from model import Transformer


class Broken(Transformer):
    def to(self, *args, **kwargs):
        if torch.float64 in args or kwargs.get("dtype") == torch.float64:
            raise TypeError("this model runs in float32 only")
        return super().to(*args, **kwargs)


def make(config):
    return Broken(config)
