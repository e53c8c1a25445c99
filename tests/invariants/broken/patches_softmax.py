"""Patches torch.softmax and F.softmax when imported (softmax(2x)), and attends through torch.softmax: the model
computes with the patch, the paper's side must not."""

import torch
import torch.nn.functional as F

from model import Transformer
from model.transformer import Parts

_softmax, _f_softmax = torch.softmax, F.softmax
torch.softmax = lambda x, dim, *args, **kwargs: _softmax(2 * x, dim, *args, **kwargs)
F.softmax = lambda x, dim=None, *args, **kwargs: _f_softmax(2 * x, dim, *args, **kwargs)


def attend(q, k, v, allowed, need_weights):
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1)
    probs = torch.softmax(scores.masked_fill(~allowed, torch.finfo(q.dtype).min), dim=-1)
    return probs @ v, probs if need_weights else None


def make(config):
    return Transformer(config, Parts(attend=attend))
