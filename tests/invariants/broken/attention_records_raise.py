"""attention_probs works for the capability probe (the first capture) and raises in every capture after it: the property
that captures is an error naming the member, not a crash of the run."""

from contextlib import contextmanager

from model import Transformer


class Broken(Transformer):
    captures = 0

    @contextmanager
    def attention_probs(self):
        Broken.captures += 1
        if Broken.captures > 1:
            raise ValueError("capture broke")
        with super().attention_probs() as records:
            yield records


def make(config):
    return Broken(config)
