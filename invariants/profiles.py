"""Hypothesis profiles: dev (random, quick), ci (derandomized, quick) and thorough (random, many examples).

`dev` and `thorough` are registered with hypothesis, so HYPOTHESIS_PROFILE=dev|thorough selects them in
pytest too. `ci` is hypothesis's own derandomized profile (loaded automatically when CI is set) with the
suite's example count; it is not re-registered, so hypothesis's `ci` is never overridden.
"""
from __future__ import annotations

import os

from hypothesis import settings

ENV_VAR = "HYPOTHESIS_PROFILE"
EXAMPLES = {"dev": 10, "ci": 10, "thorough": 200}  # drawn cases per property, after the pinned ones


def register() -> None:
    settings.register_profile("dev", max_examples=EXAMPLES["dev"], deadline=None)
    settings.register_profile("thorough", max_examples=EXAMPLES["thorough"], deadline=None)


def profile(name: str) -> settings:
    """The settings the suite runs under for a profile name (dev, ci or thorough)."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown hypothesis profile {name!r}; valid: {', '.join(EXAMPLES)}")
    register()
    parent = settings.get_profile(name)
    return settings(parent, max_examples=EXAMPLES[name], deadline=None)


def default_name() -> str:
    """$HYPOTHESIS_PROFILE when it names one of the suite's profiles, else ci (derandomized)."""
    name = os.environ.get(ENV_VAR, "")
    return name if name in EXAMPLES else "ci"
