"""The package's extras (model/extras.py): the core runs the checks, and a command whose extra is missing says in one
line which to install."""

import subprocess
import sys

import pytest

from model.extras import EXTRA_OF, require
from tests.helpers import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_each_module_named_for_an_extra_is_one_that_extra_installs():
    extras = PROJECT["optional-dependencies"]
    for module, extra in EXTRA_OF.items():
        assert any(pin.split("==")[0].replace("-", "_") == module for pin in extras[extra]), (module, extra)


def test_the_core_holds_no_module_of_an_extra():
    core = {pin.split("==")[0] for pin in PROJECT["dependencies"]}
    assert not core & set(EXTRA_OF)


def test_a_missing_module_of_the_grid_extra_stops_the_runner_with_one_line_naming_the_extra():
    code = "import sys, runpy; sys.modules['sacrebleu'] = None; runpy.run_module('ablations', run_name='__main__')"
    run = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(
        "error: the Table 3 runner (ablations) needs sacrebleu, which come with the grid extra"
    )
    assert "pip install 'aiayn-harness[grid]'" in run.stderr


def test_with_every_module_of_an_extra_present_nothing_is_said():
    require("grid", "the reports")  # this venv has the test extra, which holds grid
