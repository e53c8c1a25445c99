"""Fan-out of grid rows: plain processes (one per GPU, or CPU workers here) and submitit's local executor.

The runs folder is the only shared state: a row finished by one fan-out is skipped by the next, whichever
executor runs it.
"""

import signal
import threading
import time

import pytest

from ablations.grid import fanout
from ablations.grid.fanout import main, split, without
from ablations.runs import folder as R
from plumbing.stopping import Stopped, graceful_stops
from tests.helpers import DEV_PAIRS, REAL_DATA, needs_data, runs_folder, smoke_cache


def test_rows_and_seeds_are_taken_out_of_the_arguments_passed_on():
    argv = ["--budget", "smoke", "--rows", "base,A", "--seeds=1-2", "--steps", "4"]
    assert without(argv, ("--rows", "--seeds")) == ["--budget", "smoke", "--steps", "4"]


def split_here(tmp_path, *argv: str):
    """split() on a request whose data and runs folders exist: it checks the request as the runner does."""
    return split([*argv, "--data", str(tmp_path), "--runs", str(tmp_path / "runs")])


def test_each_row_and_seed_becomes_one_run_of_the_runner(tmp_path):
    _, jobs = split_here(tmp_path, "--budget", "smoke", "--rows", "B", "--seeds", "1,3", "--steps", "4")
    assert [job.name for job in jobs] == ["B1-s1", "B1-s3", "B2-s1", "B2-s3"]
    assert jobs[1].argv == (
        "run",
        "--budget",
        "smoke",
        "--steps",
        "4",
        "--data",
        str(tmp_path),
        "--runs",
        str(tmp_path / "runs"),
        "--rows",
        "B1",
        "--seeds",
        "3",
    )


def test_a_bad_run_option_is_refused_before_any_run_starts(tmp_path, capsys):
    assert main(["--workers", "2", "--budget", "smoke", "--rows", "Z9", "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: unknown row 'Z9'; valid rows: all, base")


def test_gpu_indices_must_be_numbers(capsys):
    assert main(["--gpus", "0,one", "--budget", "smoke", "--rows", "base", "--data", str(REAL_DATA)]) == 2
    assert capsys.readouterr().err.startswith("error: --gpus '0,one': give GPU indices such as 0,1,2,3")


def test_one_run_per_gpu_at_a_time_each_seeing_only_its_gpu(tmp_path, monkeypatch):
    running, seen, peak = set(), [], [0]
    lock = threading.Lock()

    class FakeRun:  # stands in for `python -m ablations run ...` on a machine with GPUs 0 and 1
        def __init__(self, command, env, **_):
            self.command, self.gpu = command, env["CUDA_VISIBLE_DEVICES"]
            with lock:
                assert self.gpu not in running, f"GPU {self.gpu} given to two runs at once"
                running.add(self.gpu)
                peak[0] = max(peak[0], len(running))
                seen.append((command[-3], self.gpu))

        def wait(self) -> int:
            time.sleep(0.05)
            with lock:
                running.remove(self.gpu)
            return 0

    monkeypatch.setattr(fanout.subprocess, "Popen", FakeRun)
    _, jobs = split_here(tmp_path, "--budget", "smoke", "--rows", "A,B")
    codes = fanout.run_local(jobs, ["0", "1"], tmp_path)
    assert codes == {job.name: 0 for job in jobs}
    assert sorted(row for row, _ in seen) == sorted(job.row for job in jobs) and {gpu for _, gpu in seen} == {"0", "1"}
    assert peak[0] == 2


def test_a_sigterm_to_the_fan_out_alone_reaches_each_run_under_way_and_no_new_run_starts(tmp_path, monkeypatch):
    started, signalled = [], []

    class FakeRun:  # a run that trains until it is told to stop, then checkpoints and exits 128 + the signal
        def __init__(self, command, start_new_session, **_):
            assert start_new_session  # so that a terminal's Ctrl-C reaches the runs once, through the fan-out
            self.stopped = threading.Event()
            started.append(command[-3])

        def send_signal(self, signum: int) -> None:
            signalled.append(signum)
            self.stopped.set()

        def wait(self) -> int:
            self.stopped.wait()
            return 128 + signalled[-1]

    monkeypatch.setattr(fanout.subprocess, "Popen", FakeRun)
    _, jobs = split_here(tmp_path, "--budget", "smoke", "--rows", "A")  # 4 runs on 2 workers
    main_thread = threading.main_thread().ident
    threading.Timer(0.3, signal.pthread_kill, (main_thread, signal.SIGTERM)).start()  # `kill PID` of the fan-out
    with graceful_stops(), pytest.raises(Stopped) as stop:
        fanout.run_local(jobs, [None, None], tmp_path)
    assert stop.value.signum == signal.SIGTERM
    assert len(started) == 2 and signalled == [signal.SIGTERM, signal.SIGTERM]


def finals(runs) -> dict:
    return {
        path.parent.name: (path.stat().st_mtime_ns, R.read_json(path)["status"])
        for path in (runs / "smoke").glob(f"*/{R.FINAL}")
    }


@needs_data
@pytest.mark.slow
@pytest.mark.serial
def test_rows_fanned_out_finish_anywhere_and_a_finished_row_is_skipped(tmp_path_factory, capsys):
    runs = runs_folder(tmp_path_factory.mktemp("fanout"), smoke_cache(tmp_path_factory))
    common = [
        "--budget",
        "smoke",
        "--steps",
        "2",  # the least training that logs, checkpoints and scores (as the runner's concurrency tests)
        "--dev-pairs",
        str(DEV_PAIRS // 5),
        "--device",
        "cpu",
        "--runs",
        str(runs),
        "--data",
        str(REAL_DATA),
    ]

    assert main(["--workers", "2", "--rows", "base,D1", *common]) == 0
    first = finals(runs)
    assert sorted(name.split("-")[0] for name in first) == ["D1", "base"]
    assert {status for _, status in first.values()} == {"finished"}
    assert (runs / "logs" / "smoke" / "D1-s1.log").is_file()

    # submitit's local executor (the SLURM path's code, as processes here) picks up the same folder: D1 is
    # skipped untouched, D2 runs. A machine without the slurm extra (a bare GPU box) stops here.
    pytest.importorskip("submitit")
    assert main(["--submitit-local", "--rows", "D1,D2", *common]) == 0
    second = finals(runs)
    assert {name: second[name] for name in first} == first
    assert sorted(name.split("-")[0] for name in second) == ["D1", "D2", "base"]
    assert capsys.readouterr().out.endswith("2 runs: 2 finished\n")
