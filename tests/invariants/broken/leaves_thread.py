"""Starts a non-daemon thread that never ends (a logger, a prefetcher): the run must still end once its report is out."""

import threading

from model import Transformer

threading.Thread(target=threading.Event().wait, name="adapter's worker").start()


def make(config):
    return Transformer(config)
