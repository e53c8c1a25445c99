"""A built wheel, installed non-editable, runs from any working directory and finds its paths there, not in the package."""

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from invariants.suite import PROPERTIES
from tests.helpers import REPO, doc_block

PACKAGES = ("plumbing", "model", "invariants", "ablations", "reports")


REPORT_DATA = {"results", "invariants", "figures", "table3"}  # folders of reports/ that hold outputs, not code


def skipped(folder: str, names: list[str]) -> list[str]:
    """Everything but sources and package data: caches, and the outputs kept beside the reports' code."""
    here = Path(folder)
    return [
        n
        for n in names
        if n == "__pycache__"
        or (here == REPO / "reports" and n in REPORT_DATA)
        or ((here / n).is_file() and not (n.endswith((".py", ".cpp", ".h")) or n == "table3.csv"))
    ]


def source_copy(dest: Path) -> Path:
    """The project's sources, so that building the wheel writes nothing (build/, egg-info) into the checkout."""
    for name in ("pyproject.toml", "README.md", "LICENSE", "pytest_aiayn.py"):
        shutil.copy(REPO / name, dest / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=skipped)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return next(out.glob("aiayn_harness-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; its dependencies come from this venv's site-packages (added as a plain path,
    so this venv's editable install of the project is not), which keeps the test to seconds and offline."""
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True, timeout=120)
    python = home / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "outer_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return home


def all_runs_but(*prefixes: str):
    """copytree's ignore for a results folder: every run folder (runs/*) but those whose name starts with a prefix."""
    return lambda folder, names: [n for n in names if Path(folder).name == "runs" and not n.startswith(prefixes)]


def run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)}
    return subprocess.run(
        [str(venv / "bin" / "python"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_wheel_declares_what_the_invariants_import_and_the_console_scripts(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        scripts = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "Requires-Dist: hypothesis==" in metadata and "Requires-Dist: torch==2.13.0" in metadata
    assert {"aiayn-invariants", "aiayn-ablations", "aiayn-reports"} <= {
        line.split("=")[0].strip() for line in scripts.splitlines()
    }
    kernels = [f"model/kernels/{name}.cpp" for name in ("attention", "narrow", "reorder", "loss")] + [
        "model/kernels/kernels.h"
    ]
    assert "model/table3.csv" in names and set(kernels) <= set(names)
    assert {f"{package}/__init__.py" for package in PACKAGES} <= set(names)  # every package, plumbing/ included
    assert "[pytest11]\naiayn-invariants = pytest_aiayn" in scripts and "pytest_aiayn.py" in names  # the pytest plugin


@pytest.mark.slow
def test_installed_package_runs_from_a_working_directory_and_reads_its_paths_there(venv, tmp_path):
    # Two of the smoke grid's 20 runs: every table and figure still has rows, and drawing 20 facets of training
    # curves took most of the reports' time.
    smoke = REPO / "reports" / "results" / "smoke"
    shutil.copytree(smoke, tmp_path / "reports" / "results" / "smoke", ignore=all_runs_but("base-", "C1-"))

    where = run(
        venv,
        tmp_path,
        "-c",
        "import model, invariants; from model import kernels; print(model.__file__, invariants.__file__); "
        "print(all(f.is_file() for f in [*kernels.SOURCES, kernels.HEADER]))",
    )
    assert where.returncode == 0, where.stderr
    files, kernel_source = where.stdout.splitlines()
    assert str(REPO) not in files and str(venv) in files  # the installed copy, not the checkout
    assert kernel_source == "True", where.stderr  # what the kernel is built from, on first use

    listed = run(venv, tmp_path, "-m", "invariants", "--list")
    assert listed.returncode == 0, listed.stderr
    assert "causal_future_tokens" in listed.stdout

    info = run(venv, tmp_path, "-m", "model", "info", "reference", "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["config"]["d_model"] == 512

    reports = run(venv, tmp_path, "-m", "reports")
    assert reports.returncode == 0, reports.stderr
    assert any((tmp_path / "reports" / "table3").glob("*smoke*"))
    assert (tmp_path / "reports" / "index.html").is_file()
    assert "wrote reports/" in reports.stdout  # paths shown relative to the working directory
    assert (venv / "bin" / "aiayn-reports").is_file() and (venv / "bin" / "aiayn-invariants").is_file()


@pytest.mark.slow
def test_the_installed_pytest_plugin_runs_the_documented_project_green_one_test_per_property(venv, tmp_path):
    # docs/plugging-in.md's project as a user copies it (the reference stands in for their model), in a folder of its
    # own; the same project with the documented bug fails: tests/invariants/test_pytest_plugin.py.
    (tmp_path / "model.py").write_text(doc_block("# model.py: your model"))
    (tmp_path / "test_model.py").write_text(doc_block("# test_model.py"))
    checked = run(venv, tmp_path, "-m", "pytest", "-p", "no:cacheprovider", "-q")
    assert checked.returncode == 0 and f"{len(PROPERTIES)} passed" in checked.stdout, (
        checked.stdout[-2000:] + checked.stderr[-2000:]
    )


def test_the_invariants_dependency_group_pins_what_the_package_pins():
    # nox -s invariants installs the group, not the package: a pin changed in one place must change in both.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = dict(
        p.split("==")
        for p in project["project"]["dependencies"] + project["project"]["optional-dependencies"]["test"]
        if "==" in p
    )
    group = dict(p.split("==") for p in project["dependency-groups"]["invariants"])
    assert group == {name: pins[name] for name in group}
