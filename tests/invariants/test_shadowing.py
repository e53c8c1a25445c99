"""The harness beside a user's own model.py or model/, invariants/ and reports/: where it works, and the one line where not.

Each command runs in a temporary folder outside the repository, as a user's project would be.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import model
from model import load_model
from model.registry import file_module_name
from invariants.suite import PROPERTIES

SMALL = "N=1,d_model=16,d_ff=32,h=2,d_k=8,d_v=8,vocab_size=40"
ADAPTER = "from model import Transformer\n\n\ndef make(config):\n    return Transformer(config)\n"
LAYOUTS = ("model.py", "model/__init__.py")  # a user's module, or package, named like the harness's


def project(folder: Path, layout: str) -> Path:
    """A user's project holding their own `model` (as layout) with a factory, and packages plumbing/, invariants/ and
    reports/."""
    for package in ("plumbing", "invariants", "reports"):
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text("raise ImportError('the user's package was imported')\n")
    (folder / layout).parent.mkdir(exist_ok=True)
    (folder / layout).write_text(ADAPTER)
    return folder


def run(folder: Path, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        list(command), cwd=folder, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_python_m_invariants_beside_a_users_model_stops_with_one_line_naming_it_and_the_fix(tmp_path, layout):
    (tmp_path / layout).parent.mkdir(exist_ok=True)
    (tmp_path / layout).write_text(ADAPTER)
    shown = "./model.py" if layout == "model.py" else "./model/"
    result = run(tmp_path, sys.executable, "-m", "invariants", "--model", f"{layout}:make", "--only", "softmax_rows")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {shown} shadows the harness's 'model' package; "
        f"run aiayn-invariants --model {layout}:make --only softmax_rows instead\n"
    )


def test_python_m_invariants_beside_a_users_plumbing_stops_with_one_line_naming_it(tmp_path):
    (tmp_path / "mine.py").write_text(ADAPTER)
    (tmp_path / "plumbing.py").write_text("")
    result = run(tmp_path, sys.executable, "-m", "invariants", "--model", "mine.py:make", "--only", "softmax_rows")
    assert result.returncode == 2
    assert result.stderr == (
        "error: ./plumbing.py shadows the harness's 'plumbing' package; "
        "run aiayn-invariants --model mine.py:make --only softmax_rows instead\n"
    )


@pytest.mark.parametrize("cli, args", [("ablations", ("publish", "--budget", "cpu")), ("reports", ("--out", "out"))])
def test_python_m_ablations_and_reports_beside_a_users_model_stop_with_one_line_naming_the_script(tmp_path, cli, args):
    (tmp_path / "model.py").write_text(ADAPTER)
    result = run(tmp_path, sys.executable, "-m", cli, *args)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: ./model.py shadows the harness's 'model' package; run aiayn-{cli} {' '.join(args)} instead\n"
    )


def test_importing_the_invariants_from_a_script_beside_a_users_model_is_an_import_error_naming_it(tmp_path):
    (tmp_path / "model.py").write_text(ADAPTER)
    (tmp_path / "check.py").write_text("import invariants\n")
    result = run(tmp_path, sys.executable, "check.py")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "ImportError: ./model.py shadows the harness's 'model' package; rename it, or keep its folder off sys.path"
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_console_script_checks_a_users_model_from_their_project(tmp_path, layout):
    project(tmp_path, layout)
    script = Path(sys.executable).parent / "aiayn-invariants"
    result = run(
        tmp_path,
        str(script),
        "--model",
        f"{layout}:make,{SMALL}",
        "--only",
        "softmax_rows,causal_future_tokens",
        "--out",
        "out",
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "2 pass, 0 fail" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_pytest_plugin_checks_a_users_model_from_their_project(tmp_path, layout):
    project(tmp_path, layout)
    (tmp_path / "test_theirs.py").write_text(
        "from pytest_aiayn import TransformerInvariants\n\n\n"
        f"class TestTheirs(TransformerInvariants):\n    spec = '{layout}:make,{SMALL}'\n"
    )
    result = run(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-k", "softmax_rows")
    assert result.returncode == 0 and f"1 passed, {len(PROPERTIES) - 1} deselected" in result.stdout, (
        result.stdout[-3000:] + result.stderr[-2000:]
    )


@pytest.mark.slow
def test_a_users_module_imported_as_model_before_the_plugin_is_a_one_line_collection_error(tmp_path):
    (tmp_path / "model.py").write_text("def make(config):\n    raise NotImplementedError\n")
    (tmp_path / "test_theirs.py").write_text(
        "import model\nfrom pytest_aiayn import TransformerInvariants\n\n\n"
        "class TestTheirs(TransformerInvariants):\n    spec = 'model.py:make'\n"
    )
    result = run(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q")
    assert result.returncode == 2, result.stdout[-3000:]
    assert (
        f"error: {tmp_path / 'model.py'} was imported as 'model', the name of the harness's own package; name your "
        "model by its path (spec = 'model.py:make')"
    ) in result.stdout


def test_a_spec_file_named_model_is_imported_by_its_path_under_a_name_of_its_own(tmp_path):
    harness_model = sys.modules["model"]
    for folder in ("a", "b"):  # two files of one stem stay two modules
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.py").write_text(
            "import dataclasses\n\nfrom model import Transformer\n\n\n@dataclasses.dataclass\nclass Options:\n"
            f"    depth: 'int' = {len(folder)}\n\n\ndef make(config):\n    return Transformer(config)\n"
        )
    with torch.device("meta"):
        built = [load_model(f"{tmp_path / folder / 'model.py'}:make,{SMALL}") for folder in ("a", "b")]
    names = [file_module_name(tmp_path / folder / "model.py") for folder in ("a", "b")]
    assert all(n.startswith("aiayn_adapter_model_") for n in names) and names[0] != names[1]
    assert all(n in sys.modules for n in names) and str(tmp_path) not in sys.path
    assert sys.modules["model"] is harness_model is model and built[0].config.N == 1
