"""The suite's hypothesis profiles mean the same wherever they run: dev and thorough random, ci derandomized."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("ci", ["", "1"])
@pytest.mark.slow
def test_dev_and_thorough_stay_random_and_ci_stays_derandomized_whether_or_not_ci_is_set(ci):
    # Hypothesis loads its derandomized ci profile at import when CI is set; a profile registered on top of the
    # loaded one would inherit that, and a user's --hypothesis-seed would then be ignored.
    code = (
        "from invariants import profiles\nprint([profiles.profile(n).derandomize for n in ('dev', 'thorough', 'ci')])"
    )
    env = {"CI": ci} if ci else {}
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert shown.strip() == "[False, False, True]"
