"""positional_encoding(False) never returns: only the checks that switch positions off hang."""

from model import Transformer


class Broken(Transformer):
    def positional_encoding(self, enabled):
        while True:
            pass


def make(config):
    return Broken(config)
