"""Any adapter, however broken, gets a true verdict: the contract is checked first, nothing crashes, nothing is lost.

Each row of tests/invariants/broken/verdicts.py is a small broken adapter and the verdict it must get; the front door
(bad specs and flags) is one line and exit status 2; a partial run, Ctrl-C or a failed write never loses verdicts nor
replaces a full report.
"""

import json
import subprocess
import sys

import pytest

from invariants import guard, report
from invariants.__main__ import main
from invariants.engine import PASS, Result
from invariants.subject import Subject
from invariants.suite import PROPERTIES, run_suite, select
from plumbing.files import StorageError
from tests.helpers import REPO, few
from tests.invariants.broken.verdicts import HERE, ROWS, SMALL

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.adapter}-{r.only.split(',')[0]}")
def test_every_broken_adapter_gets_its_verdict_naming_the_member_at_fault(row):
    results = run_suite(Subject(row.spec()), select(row.only.split(",")), few(1), timeout=row.timeout)
    assert [r.verdict for r in results] == [row.verdict] * len(results), [r.reason for r in results]
    assert row.says in results[0].reason


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model", ""], "model spec '' is empty"),
        (["--model", f"reference,{SMALL},N=2"], "N is given twice (N=1, N=2); give it once"),
        (["--model", f"{HERE / 'factory_raises.py'}:make"], "factory make raised ValueError: checkpoint path not set"),
        (
            ["--model", f"{HERE / 'lacks_loss.py'}:make"],
            "the object built lacks protocol members encode, decode, embed, loss",
        ),
        (["--model", "reference", "--timeout", "-1"], "--timeout -1: give seconds, or 0 for no limit"),
    ],
)
def test_a_bad_spec_or_flag_is_one_line_and_exit_status_2(argv, says, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def full_report(folder, spec):
    """A stand-in for a published full report of `spec` in `folder`; its text."""
    results = [Result("params_base", "5 parameters", "", PASS, 0.0, 0.0, "at_most", "", 1)]
    report.write(report.document(spec, results, "ci", "python -m invariants", 1.0), folder)
    return (folder / f"{report.slug(spec)}.md").read_text()


def test_a_replay_writes_its_own_partial_report_and_leaves_the_full_one(tmp_path):
    spec = f"reference,{SMALL}"
    before = full_report(tmp_path, spec)
    assert main(["--model", spec, "--only", "params_tied_embeddings", "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{report.slug(spec)}.md").read_text() == before
    partial = json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())
    assert partial["partial"] == f"1 of {len(PROPERTIES)} properties (--only)" and len(partial["properties"]) == 1


def test_ctrl_c_saves_the_verdicts_reached_as_a_partial_report_beside_the_full_one(tmp_path, capsys):
    spec = f"{HERE / 'interrupted.py'}:make,{SMALL}"
    before = full_report(tmp_path, spec)
    argv = ["--model", spec, "--only", "eval_determinism,pe_relative_linearity,params_base", "--out", str(tmp_path)]
    assert main(argv) == 130
    assert (tmp_path / f"{report.slug(spec)}.md").read_text() == before
    partial = json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())
    assert [p["name"] for p in partial["properties"]] == ["eval_determinism"]
    assert partial["partial"].startswith("stopped by SIGINT after 1 of 3")
    assert "the 1 verdicts reached are in" in capsys.readouterr().err


def test_sigterm_saves_the_verdicts_reached_as_ctrl_c_does_and_says_which_signal(tmp_path, capsys):
    spec = f"{HERE / 'terminated.py'}:make,{SMALL}"
    argv = ["--model", spec, "--only", "eval_determinism,pe_relative_linearity,params_base", "--out", str(tmp_path)]
    assert main(argv) == 130
    partial = json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())
    assert partial["partial"].startswith("stopped by SIGTERM after 1 of 3")
    assert capsys.readouterr().err.startswith("stopped by SIGTERM: the 1 verdicts reached are in")


def test_an_adapters_own_keyboard_interrupt_or_sys_exit_is_its_error_and_the_run_goes_on(tmp_path, capsys):
    for adapter in ("forward_interrupts", "forward_exits"):
        spec = f"{HERE / adapter}.py:make,{SMALL}"
        assert main(["--model", spec, "--only", "eval_determinism,params_base", "--out", str(tmp_path)]) == 1
        doc = json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())
        assert [p["verdict"] for p in doc["properties"]] == ["error", "pass"]
        assert "stopped by" not in capsys.readouterr().err


def command_line(*args: str) -> subprocess.CompletedProcess:
    """`python -m invariants ARGS` in a process of its own, as a user runs it (supervised), from the repository."""
    return subprocess.run(
        [sys.executable, "-m", "invariants", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_a_model_that_cancels_the_time_limit_is_still_stopped_by_the_watchdog(tmp_path, monkeypatch):
    monkeypatch.setattr(guard, "WATCHDOG_GRACE_S", 0.5)
    spec = f"{HERE / 'cancels_alarm.py'}:make,{SMALL}"
    argv = ["--model", spec, "--only", "pe_relative_linearity,params_base", "--timeout", "1", "--out", str(tmp_path)]
    assert main(argv) == 1
    doc = json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())
    assert [p["verdict"] for p in doc["properties"]] == ["error", "pass"]
    assert doc["properties"][0]["reason"].startswith("timed out after 1 s")


def test_a_thread_an_adapter_leaves_running_does_not_keep_the_finished_run_alive(tmp_path):
    spec = f"{HERE / 'leaves_thread.py'}:make,{SMALL}"
    run = command_line("--model", spec, "--only", "params_base", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / f"{report.slug(spec)}.partial.json").exists()


def test_an_adapter_that_patches_torch_softmax_fails_the_oracle_it_cannot_fool(tmp_path):
    # In a process of its own: the patch is torch's for the rest of the process it is imported in.
    spec = f"{HERE / 'patches_softmax.py'}:make,{SMALL}"
    assert command_line("--model", spec, "--only", "oracle_encoder", "--out", str(tmp_path)).returncode == 1
    (verdict,) = json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())["properties"]
    assert verdict["verdict"] == "fail"
    assert "torch functions changed since the harness was imported: torch.softmax" in verdict["reason"]


def test_a_model_that_ends_the_process_itself_never_reads_as_success(tmp_path):
    spec = f"{HERE / 'forward_os_exit.py'}:make,{SMALL}"
    run = command_line("--model", spec, "--only", "eval_determinism", "--out", str(tmp_path))
    assert run.returncode == 1
    assert run.stderr.startswith("error: the run ended before its verdicts were written (exit status 0)")


def test_a_closed_stdout_loses_no_report_and_no_exit_status(tmp_path, monkeypatch):
    def closed(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("builtins.print", closed)
    monkeypatch.setattr("os.dup2", lambda *args: None)  # the pipe is simulated: the real stdout stays open
    spec = f"reference,{SMALL}"
    assert main(["--model", spec, "--only", "params_base", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / f"{report.slug(spec)}.partial.json").read_text())["verdicts"]["pass"] == 1


def test_a_failed_write_saves_the_verdicts_elsewhere_and_says_where(tmp_path, monkeypatch, capsys):
    real_write = report.write

    def full_disk(doc, out):
        if out == tmp_path:
            raise StorageError(out / "x.json", OSError(28, "No space left on device"))
        return real_write(doc, out)

    monkeypatch.setattr(report, "write", full_disk)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    assert main(["--model", f"reference,{SMALL}", "--only", "params_base", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "the report could not be written to" in err and "Traceback" not in err
    assert list((tmp_path / "tmp" / "aiayn-invariants").glob("*.partial.json"))


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ("vocab_size=1", "not applicable at vocab_size=1: this property needs at least 9 tokens"),
        ("max_len=1", "not applicable at max_len=1: this property needs at least 8 positions"),
    ],
)
def test_a_config_too_small_for_the_harness_is_said_as_the_harness_limit(overrides, says):
    spec = f"reference,{SMALL.replace(',vocab_size=50', '')},{overrides}"
    results = run_suite(spec, select(["causal_future_tokens", "fast_equals_explicit", "params_base"]), few(1))
    assert [r.verdict for r in results] == ["not_applicable", "not_applicable", "pass"]
    assert all(says in r.reason and "a limit of the harness" in r.reason for r in results[:2])
