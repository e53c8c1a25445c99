"""One writer per run: any number of grid processes on one runs folder share its runs out between them.

Each run directory has an OS lock (flock) that the kernel releases when its holder exits or dies; a process
that finds a run locked leaves it to the holder. Started together or one after another, N processes must
train every run exactly once, and end with the same results as one process alone.

The processes are forked from the test process, which has torch and the runner imported already: each is a
real OS process with its own pid, locks and signal handlers, started in a fraction of a second instead of
the ~10 s a fresh interpreter spends importing torch on a loaded 2-core machine.
"""

import multiprocessing
import os
import re
import shutil
import sys
import time

import pytest
import torch

from ablations.__main__ import main
from ablations.runs import folder as R
from ablations.training.train import make_optimizer
from tests.helpers import DEV_PAIRS, logged, needs_data, result, runs_folder, smoke_cache

pytestmark = [needs_data, pytest.mark.slow, pytest.mark.serial]  # 2 to 4 runner processes at once
ROWS = [
    "D1",
    "D2",
    "D3",
    "D4",
]  # four runs of base's size; two steps: the least training that logs, checkpoints, scores
FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    make_optimizer(torch.nn.Linear(1, 1), torch.device("cpu"))  # imports what Adam imports once, before the forks
    return smoke_cache(tmp_path_factory)


def argv(runs, rows=ROWS):
    return [
        "run",
        "--budget",
        "smoke",
        "--rows",
        ",".join(rows),
        "--steps",
        "2",
        "--dev-pairs",
        str(DEV_PAIRS // 5),
        "--device",
        "cpu",
        "--runs",
        str(runs),
    ]


def grid_process(args: list[str], log: str) -> None:
    """A grid process: `python -m ablations run ...` with its output in log (runs in a forked child)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout, sys.stderr = os.fdopen(1, "w", buffering=1), os.fdopen(2, "w", buffering=1)
    sys.exit(main(args))


def start(args, log):
    proc = FORK.Process(target=grid_process, args=(args, str(log)))
    proc.start()
    return proc


def run_dirs(runs):
    return {p.parent.name: p.parent for p in (runs / "smoke").glob(f"*/{R.CONFIG}")}


@pytest.fixture(scope="module")
def alone_runs(tmp_path_factory, cache):
    """The runs folder of the grid run by one process."""
    runs = runs_folder(tmp_path_factory.mktemp("alone"), cache)
    log = runs / "alone.log"
    proc = start(argv(runs), log)
    proc.join(timeout=300)
    assert proc.exitcode == 0, log.read_text()[-3000:]
    return runs


@pytest.fixture(scope="module")
def alone(alone_runs):
    """The results every set of concurrent processes must reproduce."""
    return {name: (result(d), logged(d)) for name, d in run_dirs(alone_runs).items()}


def wait_for(log, text: str, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not log.exists() or text not in log.read_text(errors="replace"):
        assert proc.is_alive() or (log.exists() and text in log.read_text(errors="replace")), (
            f"{log} ended without {text!r}"
        )
        assert time.monotonic() < deadline, f"no {text!r} in {log}"
        time.sleep(0.02)


@pytest.mark.parametrize("started", ["together", "staggered"])
@pytest.mark.parametrize("n", [2, 4])  # fewer processes than runs, and as many: each run taken once either way
def test_n_processes_on_one_runs_folder_train_every_run_exactly_once(n, started, tmp_path, cache, alone):
    runs = runs_folder(tmp_path / "runs", cache)
    logs = [tmp_path / f"p{i}.log" for i in range(n)]
    procs = []
    for log in logs:
        procs.append(start(argv(runs), log))
        if started == "staggered":  # the next one starts once this one is taking runs
            wait_for(log, "grid smoke", procs[-1])
    for proc in procs:
        proc.join(timeout=300)
    outputs = [log.read_text(errors="replace") for log in logs]
    assert [p.exitcode for p in procs] == [0] * n, "\n\n".join(o[-1500:] for o in outputs)

    # Exactly once: a run's outcome line ("D1 s1: finished ...") is printed by the one process that trained it.
    trained = [row for out in outputs for row in re.findall(r"(?:^|\r)\s*(D\d) s1: finished ", out, re.M)]
    assert sorted(trained) == ROWS, trained
    dirs = run_dirs(runs)
    assert set(dirs) == set(alone)
    for name, directory in dirs.items():
        assert (result(directory), logged(directory)) == alone[name], name  # same numbers, metrics never mixed
        assert not (directory / R.ATTEMPTS).exists(), f"{name}: a failure was recorded"
        assert not list(directory.glob(".*.tmp*")), f"{name}: temporary files left behind"
    for out in outputs:
        assert "Traceback" not in out and "error" not in out.lower(), out[-1500:]


def test_a_run_locked_by_another_process_is_left_to_it_and_taken_once_it_is_free(
    tmp_path, cache, alone_runs, alone, capsys
):
    runs = runs_folder(tmp_path / "runs", cache)
    finished = next(d for name, d in run_dirs(alone_runs).items() if name.startswith(f"{ROWS[0]}-"))
    directory = runs / "smoke" / finished.name
    shutil.copytree(finished, directory)  # D1 as one process trained it
    (directory / R.FINAL).unlink()  # unfinished again
    capsys.readouterr()
    with R.claim(directory) as mine:  # another holder: flock conflicts between two descriptors of one process too
        assert mine
        assert main(argv(runs)) == 0
        err = capsys.readouterr().err
        assert re.search(r"(?:^|\r)\s*D1 s1: running elsewhere \(pid \d+ on ", err, re.M), err[-2000:]
        assert re.search(r"^\s*D1 s1 running elsewhere: pid \d+ on .* holds its lock", err, re.M), err[-2000:]
        assert not (directory / R.FINAL).exists()  # not trained twice, nothing written under the other's lock
    assert main(argv(runs)) == 0  # the lock is free: the run is taken and finished
    assert (result(directory), logged(directory)) == alone[directory.name]
