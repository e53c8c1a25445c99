"""One run of a fanned-out grid as a job: shared by the local fan-out (ablations.grid.fanout) and SLURM (ablations.grid.slurm)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    """One (row, seed) of the grid and the `python -m ablations` arguments that run it."""

    row: str
    seed: int
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.row}-s{self.seed}"
