"""Stops and storage faults end a grid in one line and leave it resumable.

SIGINT (Ctrl-C) and SIGTERM (a SLURM time limit) let the step under way finish, write a checkpoint of it and
exit 130 / 143 with one line saying how to resume; the resumed grid ends exactly as an uninterrupted one
(CPU, one thread). A full disk or a read-only folder (simulated: the writer raises as the OS would) is one
line naming the path; finished results are untouched and nothing is recorded as failed.

Each grid is rows D1,D2 and is stopped in D2: D1 is copied finished from the uninterrupted grid, not trained again.
"""

import errno
import multiprocessing
import os
import random
import re
import shutil
import signal
import sys
import time

import pytest
import torch

from ablations.__main__ import main
from ablations.runs import folder as R
from ablations.training.checkpoints import read_checkpoint
from ablations.training.train import make_optimizer
from model import Transformer
from plumbing import files
from plumbing.stopping import stops_cleanly
from tests.helpers import ablations_argv, logged, needs_data, result, runs_folder, smoke_cache

pytestmark = needs_data
FORK = multiprocessing.get_context("fork")
SPEC = "tests.ablations.test_runner_stops:signalling_model"
SIGNAL_AT: dict[str, int] = {}  # set in a forked child: {"signum": ..., "step": ...}; empty: no signal


class SignallingModel(Transformer):
    """The reference model that, in row D2 (P_drop 0.2), sends SIGNAL_AT's signal to its own process from inside
    the forward pass of training step SIGNAL_AT['step']: a stop that arrives mid-step, at a known step."""

    def __init__(self, config):
        super().__init__(config)
        self.steps = 0

    def forward(self, *args):
        if self.training and self.config.P_drop == 0.2:
            self.steps += 1
            if SIGNAL_AT and self.steps == SIGNAL_AT["step"]:
                os.kill(os.getpid(), SIGNAL_AT["signum"])
        return super().forward(*args)


def signalling_model(config):
    return SignallingModel(config)


def argv(runs, steps=12, rows="D1,D2", spec=SPEC):
    return ablations_argv(runs, rows, "--model", spec, steps=steps, dev_pairs=4)


def grid_process(args, log, signal_at):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout, sys.stderr = os.fdopen(1, "w", buffering=1), os.fdopen(2, "w", buffering=1)
    SIGNAL_AT.update(signal_at)
    code = main(args)
    # A stop that lands after the grid ended (the test allows it: exit 0) must not hit multiprocessing's own exit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def start(args, log, signal_at=None):
    proc = FORK.Process(target=grid_process, args=(args, str(log), signal_at or {}))
    proc.start()
    return proc


def finish(args, log, signal_at=None) -> int:
    proc = start(args, log, signal_at)
    proc.join(timeout=300)
    return proc.exitcode


def run_dirs(runs):
    return {d.name.split("-")[0]: d for d in (runs / "smoke").iterdir()}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    make_optimizer(torch.nn.Linear(1, 1), torch.device("cpu"))  # imports what Adam imports once, before the forks
    return smoke_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, cache):
    """The runs folder of the grid run without a stop."""
    runs = runs_folder(tmp_path_factory.mktemp("whole"), cache)
    assert finish(argv(runs), runs / "log") == 0, (runs / "log").read_text()[-2000:]
    return runs


@pytest.fixture(scope="module")
def uninterrupted(whole):
    return {row: (result(d), logged(d)) for row, d in run_dirs(whole).items()}


def with_d1_finished(runs, whole):
    """runs with the uninterrupted grid's finished D1 in it: a grid of D1,D2 keeps it and trains D2 alone."""
    finished = run_dirs(whole)["D1"]
    shutil.copytree(finished, runs / "smoke" / finished.name)
    return runs


def text(log) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def last_line(log) -> str:
    return re.split(r"[\r\n]", log.read_text(errors="replace").rstrip())[-1]


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
@pytest.mark.serial
def test_a_stop_signal_mid_step_checkpoints_that_step_and_a_resume_ends_as_the_uninterrupted_run(
    signum, status, tmp_path, cache, whole, uninterrupted
):
    runs = with_d1_finished(runs_folder(tmp_path / "runs", cache), whole)
    log = tmp_path / "log"
    assert finish(argv(runs), log, {"signum": signum, "step": 5}) == status
    name = signal.Signals(signum).name
    assert re.fullmatch(
        rf"stopped by {name} \(D2 s1 at step 5, checkpoint saved\); finished runs are kept; "
        rf"resume with: python -m ablations run --budget smoke --rows D1,D2 .*--model {SPEC}",
        last_line(log),
    )
    assert "Traceback" not in log.read_text(errors="replace")
    d1, d2 = run_dirs(runs)["D1"], run_dirs(runs)["D2"]
    assert R.status(d1) == "finished" and R.status(d2) == "partial"
    assert read_checkpoint(d2 / R.CHECKPOINT)["state"]["step"] == 5  # the step it arrived in was finished and saved
    assert not (d2 / R.ATTEMPTS).exists()  # a stop is not a failure
    before = (d1 / R.FINAL).read_bytes()

    assert finish(argv(runs), log) == 0
    assert "D2 s1: resuming from checkpoint.pt at step 5" in log.read_text(errors="replace")
    assert (d1 / R.FINAL).read_bytes() == before
    assert {row: (result(d), logged(d)) for row, d in run_dirs(runs).items()} == uninterrupted


@pytest.mark.slow
@pytest.mark.serial
def test_a_stop_signal_at_a_random_moment_resumes_to_the_uninterrupted_result(tmp_path, cache, whole, uninterrupted):
    runs = with_d1_finished(runs_folder(tmp_path / "runs", cache), whole)
    log = tmp_path / "log"
    proc = start(argv(runs), log)
    target = random.Random().randint(1, 11)
    while not re.search(rf"D2 s1: +\d+%.*\b({'|'.join(map(str, range(target, 13)))})/12 \[", text(log)):
        assert proc.is_alive(), log.read_text(errors="replace")[-2000:]
        time.sleep(0.01)
    time.sleep(random.uniform(0, 0.3))  # anywhere: in a step, between steps, scoring
    os.kill(proc.pid, signal.SIGINT)
    proc.join(timeout=120)
    assert proc.exitcode in (130, 0), log.read_text(errors="replace")[-2000:]  # 0: it had just finished
    assert "Traceback" not in log.read_text(errors="replace")
    assert finish(argv(runs), log) == 0
    assert {row: (result(d), logged(d)) for row, d in run_dirs(runs).items()} == uninterrupted, (
        f"stopped near step {target}"
    )


# --- a full disk, a read-only folder ------------------------------------------------------------------------------


def failing_writer(monkeypatch, code: int, *where: str):
    """put_bytes raising OSError(code) for the files whose path contains every one of `where`, as the OS does."""
    real = files.put_bytes

    def put_bytes(path, data):
        if all(w in str(path) for w in where):
            raise OSError(code, os.strerror(code), str(path))
        real(path, data)

    monkeypatch.setattr(files, "put_bytes", put_bytes)


@pytest.mark.parametrize(
    "code, where, target",
    [
        (errno.ENOSPC, "/.config.json.tmp", "config.json"),  # before training
        (errno.ENOSPC, "/.checkpoint.pt.tmp", "checkpoint.pt"),  # at the first checkpoint
        (errno.ENOSPC, "/.final.json.tmp", "final.json"),  # after training and scoring
        (errno.EROFS, "/.checkpoint.pt.tmp", "checkpoint.pt"),  # the folder became read-only
    ],
    ids=["ENOSPC config", "ENOSPC checkpoint", "ENOSPC final", "EROFS checkpoint"],
)
@pytest.mark.slow
def test_a_full_disk_or_read_only_folder_is_one_line_and_finished_results_stay(
    code, where, target, tmp_path, cache, monkeypatch, capsys, whole, uninterrupted
):
    runs = with_d1_finished(runs_folder(tmp_path / "runs", cache), whole)  # D1 finished before the disk fills
    d1 = run_dirs(runs)["D1"]
    before = {p.name: p.read_bytes() for p in d1.iterdir()}
    failing_writer(monkeypatch, code, "/D2-s1-", where)
    capsys.readouterr()

    assert main(argv(runs)) == 1
    err = capsys.readouterr().err
    reason = os.strerror(code)
    line = last_line_of(err)
    assert re.fullmatch(
        rf"error: cannot write {re.escape(str(runs))}/smoke/D2-s1-\w+/{target}: {reason} \({errno.errorcode[code]}\); "
        rf".*then run again \(finished runs are kept; an unfinished one resumes from its last checkpoint\)",
        line,
    ), line
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in d1.iterdir()} == before
    d2 = run_dirs(runs)["D2"]
    assert not (d2 / R.ATTEMPTS).exists() and R.status(d2) != "failed"  # the disk's fault, not the run's
    assert not list(d2.glob(".*.tmp*"))

    monkeypatch.undo()  # space freed: the grid resumes and ends as if nothing happened
    assert main(argv(runs)) == 0
    assert {row: (result(d), logged(d)) for row, d in run_dirs(runs).items()} == uninterrupted


def last_line_of(text: str) -> str:
    return re.split(r"[\r\n]", text.rstrip())[-1]


def test_a_failure_that_cannot_be_recorded_on_a_full_disk_is_one_line(tmp_path, cache, monkeypatch, capsys):
    runs = runs_folder(tmp_path / "runs", cache)
    failing_writer(monkeypatch, errno.ENOSPC, R.ATTEMPTS)
    # The model builds for the check before the grid (the base row) and fails in row D2 only.
    assert main(argv(runs, 2, "D2", "tests.ablations.test_runner_stops:fails_in_d2")) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.fullmatch(
        r"error: cannot write \S+/D2-s1-\w+/attempts\.json: No space left on device \(ENOSPC\); .*", last_line_of(err)
    ), last_line_of(err)


def fails_in_d2(config):
    if config.P_drop == 0.2:
        raise RuntimeError("cannot build this model")
    return Transformer(config)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.serial
def test_a_command_without_steps_stops_in_one_line_with_the_shells_exit_status(signum, capsys):
    @stops_cleanly("nothing written")
    def command() -> int:
        os.kill(os.getpid(), signum)  # Ctrl-C, or what SLURM sends
        time.sleep(5)  # the handler raises before this ends
        return 0

    before = signal.getsignal(signum)
    assert command() == 128 + signum
    assert capsys.readouterr().err == f"stopped by {signal.Signals(signum).name}: nothing written\n"
    assert signal.getsignal(signum) is before  # the handlers of before the command are back
