"""Cancels the harness's alarm, then never returns, while the PE table is read at length (after the contract)."""

import signal
import time

from model import Transformer


class Broken(Transformer):
    def positional_table(self, positions):
        if positions > 100:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                time.sleep(0.01)
        return super().positional_table(positions)


def make(config):
    return Broken(config)
