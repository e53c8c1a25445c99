"""Each training step's time, without making the host wait for the GPU at every step.

On a GPU the host queues a step's kernels and goes on; timing it with the host's clock measures the queueing. CUDA
events recorded at each step's start and end mark when the GPU got there; the intervals are read at logging steps,
where the loop waits for the GPU anyway. On the CPU the host's clock is the step's. Each step is timed from its own
start, so nothing the loop does between steps (evaluation, a checkpoint, logging) is counted in the step after it.
Steps in which torch.compile compiled are kept apart, so that compile time is reported beside the steady step time,
not inside it; the longest step of all, compiling ones included, is reported too: a recompile mid-run is a stall.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch


def percentiles(times: list[float]) -> dict[str, float | None]:
    """Median, 99th percentile (nearest rank: the largest of fewer than 100 times) and largest of `times`."""
    if not times:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(times)
    return {"p50": statistics.median(ordered), "p99": ordered[math.ceil(0.99 * len(ordered)) - 1], "max": ordered[-1]}


@dataclass
class Laps:
    """Step times read back since the last reading: seconds of plain steps (and the tokens they trained on), seconds
    of steps that compiled, and how many graphs those compiled."""

    steps: list[float] = field(default_factory=list)
    compiling: list[float] = field(default_factory=list)
    steady_tokens: int = 0
    compiles: int = 0

    def add(self, other: Laps) -> None:
        self.steps += other.steps
        self.compiling += other.compiling
        self.steady_tokens += other.steady_tokens
        self.compiles += other.compiles

    def summary(self) -> dict[str, float | int | None]:
        """A logged window: the steady rate (plain steps' tokens over their seconds), the plain steps' median and
        longest time, the longest of all its steps (compiling ones included), and the compiling steps' seconds and
        graphs."""
        seconds, spread = sum(self.steps), percentiles(self.steps)
        return {
            "tokens_per_s": self.steady_tokens / seconds if seconds else None,
            "step_s_p50": spread["p50"],
            "step_s_max": spread["max"],
            "step_s_max_all": max(self.steps + self.compiling, default=None),
            "compile_s": sum(self.compiling),
            "compiles": self.compiles,
        }


class StepClock:
    """`start` and `lap` mark each step's start and end; `read` returns the times of the steps marked since the last
    read."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.begun: torch.cuda.Event | float | None = None
        self.marked: list[tuple[torch.cuda.Event | float, torch.cuda.Event | float, int, int]] = []

    def _mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        """A step begins: whatever ran since the last one ended is not timed."""
        self.begun = self._mark()

    def lap(self, graphs: int = 0, tokens: int = 0) -> None:
        """The step begun at `start` ended, having compiled `graphs` graphs and trained on `tokens` tokens."""
        self.marked.append((self.begun, self._mark(), graphs, tokens))

    def read(self) -> Laps:
        """Times of the steps since the last read (on a GPU this waits for the last of them to finish)."""
        if self.cuda and self.marked:
            self.marked[-1][1].synchronize()
        laps = Laps()
        for begun, ended, graphs, tokens in self.marked:
            seconds = begun.elapsed_time(ended) / 1000 if self.cuda else ended - begun
            if graphs:
                laps.compiling.append(seconds)
                laps.compiles += graphs
            else:
                laps.steps.append(seconds)
                laps.steady_tokens += tokens
        self.marked = []
        return laps
