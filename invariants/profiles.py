"""Hypothesis profiles: dev (random, quick), ci (derandomized, quick) and thorough (random, many examples).

`dev` and `thorough` are registered with hypothesis, so HYPOTHESIS_PROFILE=dev|thorough selects them in
pytest too (there: hypothesis's default 100 examples, or 1000, with no deadline, since torch work is slow
to start). `ci` is hypothesis's own derandomized profile, loaded automatically when CI is set; it is not
re-registered, so it is never overridden. The suite itself (python -m invariants) draws EXAMPLES[profile]
cases per property under the profile's other settings: the pinned base-model cases come on top.
"""

from __future__ import annotations

import os

from hypothesis import settings

ENV_VAR = "HYPOTHESIS_PROFILE"
EXAMPLES = {"dev": 10, "ci": 10, "thorough": 200}  # drawn cases per property in the suite


def register() -> None:
    """dev and thorough on hypothesis's own default, not on whichever profile is loaded (ci where CI is set), so
    that they stay random everywhere."""
    default = settings.get_profile("default")
    settings.register_profile("dev", parent=default, deadline=None)
    settings.register_profile("thorough", parent=default, max_examples=1000, deadline=None)


def profile(name: str) -> settings:
    """The settings the suite runs under for a profile name (dev, ci or thorough)."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown hypothesis profile {name!r}; valid: {', '.join(EXAMPLES)}")
    register()
    return settings(settings.get_profile(name), max_examples=EXAMPLES[name], deadline=None)


def default_name() -> str:
    """$HYPOTHESIS_PROFILE when it names one of the suite's profiles, else ci (derandomized)."""
    name = os.environ.get(ENV_VAR, "")
    return name if name in EXAMPLES else "ci"
