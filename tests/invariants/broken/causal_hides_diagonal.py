"""A causal mask that also hides the diagonal (keys < i instead of <= i): position 0 then attends to nothing. It fails
the causal and softmax properties; dropout_sites' failure on it is a consequence, and its message must say so
(tests/invariants/test_messages.py)."""

from model import Transformer
from model.transformer import Parts, causal_mask


def strictly_past(queries: int, keys: int, offset: int, device=None):
    return causal_mask(queries, keys, offset - 1, device)


def make(config):
    return Transformer(config, Parts(causal_mask=strictly_past))
