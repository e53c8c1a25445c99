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
torch.set_num_threads(1)  # and in every test: one_thread below
if os.environ.get(profiles.ENV_VAR):
    settings.load_profile(os.environ[profiles.ENV_VAR])
elif settings.get_current_profile_name() != "ci":
    settings.load_profile("dev")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread in every test, whatever the code a test ran set (the runner and the benchmark set their
    own): the tests' matrices are small, and on a shared machine OpenMP threads that spin while waiting for a busy
    core make a run many times slower. Set after each test too, for the module fixtures that the next one sets up
    first. The processes the tests start get OMP_NUM_THREADS=1 (tests/helpers.py)."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)
