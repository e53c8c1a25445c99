"""Hypothesis profiles for the whole test suite, chosen by HYPOTHESIS_PROFILE (dev, ci, thorough).

With CI set and no HYPOTHESIS_PROFILE, hypothesis has already loaded its own derandomized `ci` profile;
it is left in place. Otherwise the default is `dev`.
"""
import os

from hypothesis import settings

from invariants import profiles

profiles.register()
if os.environ.get(profiles.ENV_VAR):
    settings.load_profile(os.environ[profiles.ENV_VAR])
elif settings.get_current_profile_name() != "ci":
    settings.load_profile("dev")
