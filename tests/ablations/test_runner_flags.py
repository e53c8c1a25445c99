"""Every option of `python -m ablations run` is checked before any work: a bad value is one line naming the
option, the value and what is allowed, with exit status 2, and nothing is trained or written."""

import errno
import re

import pytest

from ablations.__main__ import main
from ablations.runs import options
from ablations.runs.options import parse_seeds
from plumbing import files
from tests.helpers import needs_data

pytestmark = needs_data


def model_without_groups(config):
    """The reference model whose parameter_groups() raises."""
    from model import Transformer

    class Broken(Transformer):
        def parameter_groups(self):
            raise KeyError("encoder")

    return Broken(config)


BAD = [
    (["--steps", "0"], r"--steps 0: give a whole number of at least 1"),
    (["--steps", "-5"], r"--steps -5: give a whole number of at least 1"),
    (["--steps", "many"], r"argument --steps: invalid int value: 'many'"),
    (["--warmup", "0"], r"--warmup 0: give a whole number of at least 1"),
    (["--dev-pairs", "0"], r"--dev-pairs 0: give a whole number of at least 1"),
    (["--dev-pairs", "-5"], r"--dev-pairs -5: give a whole number of at least 1"),
    (["--accumulation", "0"], r"--accumulation 0: give a whole number of at least 1"),
    (["--accumulation", "-2"], r"--accumulation -2: give a whole number of at least 1"),
    (["--accumulation", "100000"], r"--accumulation 100000: at most the budget's 400 tokens per step"),
    (["--max-attempts", "0"], r"--max-attempts 0: give a whole number of at least 1"),
    (["--seeds", "3-1"], r"--seeds '3-1': the range 3-1 is empty; write it upwards \(1-3\)"),
    (["--seeds", "1,1"], r"--seeds '1,1': seed 1 is given twice"),
    (["--seeds", "-1"], r"--seeds '-1': give seed numbers such as 1 or 1,2,3 or 1-3"),
    (["--seeds", ""], r"--seeds '': give seed numbers"),
    (["--rows", "base", "--rows", "A"], r"--rows is given twice \('base' and 'A'\); give it once"),
    (["--steps", "3", "--steps", "4"], r"--steps is given twice"),
    (["--device", "tpu"], r"--device 'tpu': give auto, cpu, cuda or cuda:N"),
    (["--budget", "huge"], r"argument --budget: invalid choice: 'huge'"),
    (["--rows", "Z9"], r"unknown row 'Z9'; valid rows: all, base"),
    (["--model", "reference,N=1"], r"--model reference,N=1: the grid sets N per Table 3 row"),
    (["--model", "reference:big"], r"--model reference:big: the grid builds each row's own config, so the preset :big"),
    (
        ["--model", "tests.ablations.test_runner_flags:model_without_groups"],
        r"--model tests\.ablations\.test_runner_flags:model_without_groups: parameter_groups\(\) raised KeyError: 'encoder'",
    ),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[" ".join(a) or "empty" for a, _ in BAD])
def test_a_bad_option_is_one_line_naming_it_and_nothing_is_written(extra, message, tmp_path, capsys):
    runs = tmp_path / "runs"
    defaults = [
        x for flag, value in (("--rows", "base"), ("--device", "cpu")) if flag not in extra for x in (flag, value)
    ]
    code = main(["run", "--runs", str(runs), *defaults, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(message, err), err
    assert not (runs / "smoke").exists()


def test_ctrl_c_while_the_flags_and_model_are_checked_is_one_line_and_status_130(tmp_path, monkeypatch, capsys):
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(options, "check_model", interrupted)
    assert main(["run", "--rows", "base", "--device", "cpu", "--runs", str(tmp_path / "runs")]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("interrupted before any run started"), err


def test_runs_pointing_at_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "results.csv"
    target.write_text("x")
    assert main(["run", "--rows", "base", "--device", "cpu", "--runs", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --runs {target}: is a file, not a folder; give a folder (created if missing)\n"


def test_a_read_only_runs_folder_is_one_line(tmp_path, monkeypatch, capsys):
    # Tests may run as root, for whom chmod does not forbid writing: the writer is made to fail as a read-only
    # file system makes it fail.
    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(files, "put_bytes", read_only)
    assert main(["run", "--rows", "base", "--device", "cpu", "--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --runs {tmp_path}: cannot write there (Read-only file system); give a writable folder\n"


def test_an_adapter_that_raises_on_import_is_one_line(tmp_path, capsys):
    adapter = tmp_path / "mine.py"
    adapter.write_text("raise RuntimeError('CUDA toolkit not found')\n")
    assert (
        main(
            ["run", "--rows", "base", "--device", "cpu", "--runs", str(tmp_path / "runs"), "--model", f"{adapter}:make"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: CUDA toolkit not found" in err and str(adapter) in err


def test_a_module_adapter_that_raises_on_import_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "raising_adapter.py").write_text("raise ValueError('bad install')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert (
        main(
            [
                "run",
                "--rows",
                "base",
                "--device",
                "cpu",
                "--runs",
                str(tmp_path / "runs"),
                "--model",
                "raising_adapter:make",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ValueError: bad install" in err, err


@pytest.mark.parametrize("text, seeds", [("1", [1]), ("1,2,5", [1, 2, 5]), ("1-3", [1, 2, 3]), ("0, 4-5", [0, 4, 5])])
def test_seeds_are_numbers_lists_and_upward_ranges(text, seeds):
    assert parse_seeds(text) == seeds
