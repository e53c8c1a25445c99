"""Fixtures that the whole suite shares, and its hypothesis profiles (dev, ci, thorough), chosen by HYPOTHESIS_PROFILE.

With CI set and no HYPOTHESIS_PROFILE, hypothesis has already loaded its own derandomized `ci` profile;
it is left in place. Otherwise the default is `dev`.
"""

import os

import pytest
import torch
from hypothesis import settings

from invariants import profiles

profiles.register()
if os.environ.get(profiles.ENV_VAR):
    settings.load_profile(os.environ[profiles.ENV_VAR])
elif settings.get_current_profile_name() != "ci":
    settings.load_profile("dev")


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread: the tests' small matrices gain nothing from a second one, and on a shared machine
    OpenMP threads that spin while waiting for a busy core make a run many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
