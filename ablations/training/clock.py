"""Each training step's wall time, without making the host wait for the GPU at every step.

On a GPU the host queues a step's kernels and goes on; timing it with the host's clock measures the queueing. A CUDA
event recorded at each step's end marks when the GPU got there; the intervals are read at logging steps, where the
loop waits for the GPU anyway. On the CPU the host's clock is the step's. Steps in which torch.compile compiled are
kept apart, so that compile time is reported beside step time, not inside it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from itertools import pairwise

import torch


def percentiles(times: list[float]) -> dict[str, float | None]:
    """Median, 99th percentile (nearest rank: the largest of fewer than 100 times) and largest of `times`."""
    if not times:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(times)
    return {"p50": statistics.median(ordered), "p99": ordered[math.ceil(0.99 * len(ordered)) - 1], "max": ordered[-1]}


@dataclass
class Laps:
    """Step times read back since the last reading: seconds of plain steps, and of steps that compiled."""

    steps: list[float] = field(default_factory=list)
    compiling: list[float] = field(default_factory=list)

    def add(self, other: Laps) -> None:
        self.steps += other.steps
        self.compiling += other.compiling

    def summary(self, tokens: int) -> dict[str, float | None]:
        """A logged window's rate and its steps' median and longest time (steps that compiled counted apart)."""
        seconds, spread = sum(self.steps) + sum(self.compiling), percentiles(self.steps)
        return {
            "tokens_per_s": tokens / seconds if seconds else None,
            "step_s_p50": spread["p50"],
            "step_s_max": spread["max"],
            "compile_s": sum(self.compiling),
        }


class StepClock:
    """Marks each step's end (`lap`); `read` returns the times of the steps marked since the last read."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.restart()

    def _mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def restart(self) -> None:
        """Start timing afresh (after work that is not a training step, such as a dev evaluation)."""
        self.marks, self.compiled = [self._mark()], []

    def lap(self, compiled: bool = False) -> None:
        """A step ended; `compiled`: torch.compile compiled a graph during it."""
        self.marks.append(self._mark())
        self.compiled.append(compiled)

    def read(self) -> Laps:
        """Times of the steps since the last read (on a GPU this waits for the last of them to finish)."""
        if self.cuda:
            self.marks[-1].synchronize()
            seconds = [a.elapsed_time(b) / 1000 for a, b in pairwise(self.marks)]
        else:
            seconds = [b - a for a, b in pairwise(self.marks)]
        laps = Laps()
        for s, compiled in zip(seconds, self.compiled):
            (laps.compiling if compiled else laps.steps).append(s)
        self.marks, self.compiled = self.marks[-1:], []
        return laps
