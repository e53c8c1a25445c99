"""Fixtures that the whole suite shares, its hypothesis profiles (dev, ci, thorough), chosen by HYPOTHESIS_PROFILE,
and how its tests are spread over pytest-xdist's workers (docs/testing.md).

With CI set and no HYPOTHESIS_PROFILE, hypothesis has already loaded its own derandomized `ci` profile;
it is left in place. Otherwise the default is `dev`. Each xdist worker imports this file, so each loads the same
profile and runs on one thread.
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


# Under `--dist loadgroup` (noxfile.py's tests session) xdist sends the tests of one xdist_group to one worker.
WIDE_SCOPES = ("class", "module")  # a fixture of these scopes is built once per worker that runs its module's tests
SERIAL = "serial"  # the group of the tests marked serial: one after another, on one worker
GROUP = "xdist_group"


def pytest_configure(config: pytest.Config) -> None:
    """xdist registers its xdist_group mark; registered here too, a module's own group mark (test_bench_gpu.py's) still
    passes --strict-markers where xdist is not loaded (-p no:xdist)."""
    config.addinivalue_line("markers", f"{GROUP}(name): run these tests on one worker (pytest-xdist's loadgroup)")


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a class or module fixture of the suite's own (pytest's and plugins' have no baseid)."""
    defs = getattr(item, "_fixtureinfo", None)
    return defs is not None and any(
        d[-1].scope in WIDE_SCOPES and d[-1].baseid for d in defs.name2fixturedefs.values() if d
    )


def name_group_in_id(item: pytest.Item) -> None:
    """What xdist's loadgroup does and, on pytest 9.2, cannot (pytest-dev/pytest-xdist#1386, fixed by #1388): put the
    group into the test's id (`path::test@group`), which is how the controller's scheduler learns it."""
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers(GROUP)})
    suffix = "@" + "_".join(groups)
    if groups and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
        from _pytest.nodeid import NodeId  # pytest 9.2's structured id, which xdist 3.8 does not set

        item._id = NodeId.parse(item.nodeid + suffix)


@pytest.hookimpl(wrapper=True)  # the marks before xdist's own hook reads them, the ids after it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Under loadgroup: a module whose tests share a module (or class) fixture runs on one worker, so that the fixture
    (a trained smoke grid, a built wheel) is built once, not once per worker; tests marked `serial` (several processes,
    signals, time limits) run one after another on one worker, the module's fixture users with them; slow tests are
    handed out first."""
    if not getattr(config.option, "loadgroup", False):
        return (yield)
    module = {item: item.nodeid.split("::")[0] for item in items}
    serial = {module[item] for item in items if item.get_closest_marker(SERIAL)}
    for item in items:
        if item.get_closest_marker(SERIAL) or (module[item] in serial and shares_a_module_fixture(item)):
            item.add_marker(pytest.mark.xdist_group(SERIAL))
        elif shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module[item]))
    result = yield
    for item in items:
        name_group_in_id(item)
    # xdist hands out the groups first (the most tests first), then single tests in this order: the slow ones first,
    # so that the run does not end on one worker finishing a long test while the other waits.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    return result
