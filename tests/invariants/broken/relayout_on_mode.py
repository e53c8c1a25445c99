"""A correct model that lays W^V out anew on each mode switch (an inference layout kept apart, as some libraries do):
on eval() it files the values' weights away, on train() it puts them back. Checks must write after the switch."""

import torch

from model import Transformer
from model.attention import MultiHeadAttention


class Relayout(Transformer):
    def train(self, mode: bool = True):
        values = [m.w_v.weight for m in self.modules() if isinstance(m, MultiHeadAttention)]
        if getattr(self, "training", True) and not mode:
            self._filed = [v.detach().clone() for v in values]  # to the inference layout
        elif not getattr(self, "training", True) and mode and hasattr(self, "_filed"):
            with torch.no_grad():
                for v, filed in zip(values, self._filed):
                    v.copy_(filed)  # back to the training layout
        return super().train(mode)


def make(config):
    return Relayout(config)
