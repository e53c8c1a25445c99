"""The fixed Table 3 results (tests/reports/table3_fixture.py), read and compared once per module that asks."""

import pytest

from reports import table3
from reports.inputs import load_budget
from tests.reports.table3_fixture import write_fixture


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return load_budget(write_fixture(tmp_path_factory.mktemp("results")))


@pytest.fixture(scope="module")
def table(results):
    return table3.compare(results.runs)
