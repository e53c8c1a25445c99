"""Command lines whose mistakes are one line: the option, its value and what is allowed, exit status 2.

The runner and the other programs (studies, benchmarks) parse with OneLineParser and check their numbers and devices
here before any work, so that a bad value is never a traceback nor a usage block.
"""

from __future__ import annotations

import argparse
import re

import torch


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes as one line naming the option and what is allowed (exit status 2), not argparse's usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Once(argparse.Action):
    """An option given twice is an error, not silently its last value."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        seen = namespace.__dict__.setdefault("_given", set())
        if self.dest in seen:
            parser.error(
                f"{option_string} is given twice ({getattr(namespace, self.dest)!r} and {values!r}); give it once"
            )
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


def check_counts(*flags: tuple[str, int | None]) -> None:
    """A one-line ValueError for the first (flag, value) whose value is below 1 (None: not given, fine)."""
    for flag, value in flags:
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: give a whole number of at least 1")


def resolve_device(name: str) -> torch.device:
    """auto, cpu, cuda or cuda:N; anything else is a one-line error listing what is allowed."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", name)
    if not match:
        raise ValueError(f"--device {name!r}: give auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available; use --device cpu")
    if match[1] is not None and int(match[1]) >= torch.cuda.device_count():
        raise ValueError(
            f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return torch.device(name)
