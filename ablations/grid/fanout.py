"""Fan a grid's runs out: one run per GPU of this machine, or one SLURM job per run through submitit.

    python -m ablations.grid.fanout --gpus 0,1,2,3 --budget short --rows all      # one run per GPU at a time
    python -m ablations.grid.fanout --workers 2 --device cpu --budget smoke       # plain CPU processes
    python -m ablations.grid.fanout --slurm --partition gpu --budget short        # one SLURM job per run (pip install '.[slurm]')

There is no scheduler here. Each run is an ordinary `python -m ablations run --rows ROW --seeds SEED ...`
and the runs folder stays the single source of truth: a run already finished is skipped, one cut short
resumes from its checkpoint, so runs may finish anywhere, in any order, and a fan-out can simply be
started again. Every option after the fan-out's own is an option of `python -m ablations run`.
"""

from __future__ import annotations

import argparse
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ablations.grid.runner import Grid, PreparedData, plan_run, prepare_data
from ablations.runs import options
from ablations.runs.folder import read_final, status
from ablations.runs.jobs import Job
from ablations.runs.options import RunOptions
from ablations.runs.outcomes import summary as grid_summary
from plumbing.stopping import Stopped, graceful_stops

NARROWED = ("--rows", "--seeds")  # the fan-out sets these itself, once per run


def without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv with every `--flag value` and `--flag=value` of the given flags removed."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f"{f}=" for f in flags)):
            kept.append(arg)
    return kept


def split(run_argv: list[str]) -> tuple[RunOptions, list[Job]]:
    """The `run` options, parsed and checked, and one job per (row, seed) they select, in the paper's order."""
    request = options.parse(run_argv)
    common = without(list(request.argv), NARROWED)
    jobs = [
        Job(row.name, seed, ("run", *common, "--rows", row.name, "--seeds", str(seed)))
        for row in request.rows
        for seed in request.seeds
    ]
    return request, jobs


def warm_cache(request: RunOptions) -> PreparedData:
    """Train the shared BPE once, here, so that the runs load it instead of racing to train it side by side."""
    return prepare_data(request.budget, request.preset, request.data, request.runs)


def job_environment(slot: str | None, slots: int) -> dict[str, str]:
    """A GPU slot sees only its GPU; plain worker slots (None) see the machine as it is and share its cores."""
    env = dict(os.environ)
    if slot is None:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // slots)))
    else:
        env["CUDA_VISIBLE_DEVICES"] = slot
    return env


def run_local(jobs: list[Job], slots: list[str | None], log_dir: Path) -> dict[str, int]:
    """Run the jobs as plain processes, at most one per slot at a time; returns each job's exit status.

    A slot is a GPU index (the process sees only that GPU) or None (a plain worker). Each job's output
    goes to <log_dir>/<row>-s<seed>.log; a job that fails does not stop the others. The runs are started in
    sessions of their own, so a stop signal reaches them once, from here: Ctrl-C in the terminal or a SIGTERM
    sent to the fan-out alone (what a scheduler does) is passed on to each run under way, which checkpoints
    and exits, and no new run starts.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    free: queue.Queue[str | None] = queue.Queue()
    for slot in slots:
        free.put(slot)
    running: set[subprocess.Popen] = set()
    lock = threading.Lock()  # guards `running` and `stopping` against a stop between a slot's start and its record
    stopping: list[int] = []  # the signal passed on, once a stop has come

    def launch(job: Job) -> int:
        slot = free.get()
        try:
            with open(log_dir / f"{job.name}.log", "w", encoding="utf-8") as log:
                with lock:
                    if stopping:
                        return 128 + stopping[0]
                    process = subprocess.Popen(
                        [sys.executable, "-m", "ablations", *job.argv],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=job_environment(slot, len(slots)),
                        start_new_session=True,
                    )
                    running.add(process)
                try:
                    return process.wait()
                finally:
                    with lock:
                        running.discard(process)
        finally:
            free.put(slot)

    codes: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=len(slots)) as pool, tqdm(total=len(jobs), desc="fan-out", unit="run") as bar:
        futures = {pool.submit(launch, job): job for job in jobs}
        try:
            for future in futures:
                job = futures[future]
                codes[job.name] = future.result()
                bar.update(1)
        except BaseException as stop:  # Ctrl-C or SIGTERM: start nothing new, pass the signal on, wait for the runs
            pool.shutdown(wait=False, cancel_futures=True)
            with lock:
                stopping.append(stop.signum if isinstance(stop, Stopped) else signal.SIGINT)
                under_way = list(running)
            for process in under_way:
                process.send_signal(stopping[0])
            for process in under_way:
                process.wait()
            raise
    return codes


def summary(
    request: RunOptions, jobs: list[Job], data: PreparedData, device: torch.device, codes: dict[str, int]
) -> tuple[str, bool]:
    """The closing summary read from the runs folder (the one source of truth) and whether every run finished.

    `device` is the jobs' device type (it is part of a run's identity: bf16 and compilation on a GPU).
    """
    grid, rows = Grid.of(request, device), {row.name: row for row in request.rows}
    directories = [plan_run(grid, rows[job.row], job.seed, data).directory for job in jobs]
    text = grid_summary(directories)
    unrecorded = [job.name for job, d in zip(jobs, directories) if read_final(d) is None]
    if unrecorded:
        exits = ", ".join(f"{name} (exit status {codes.get(name)})" for name in unrecorded)
        text += f"\n{len(unrecorded)} run(s) left no result: {exits}; see their logs, then start the fan-out again"
    return text, all(status(d) == "finished" for d in directories)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m ablations.grid.fanout",
        description=__doc__.split("\n")[0],
        epilog="Any other option is passed to every `python -m ablations run`.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpus", help="GPU indices of this machine, one run on each at a time: 0,1,2,3")
    where.add_argument("--workers", type=int, help="this many plain processes at a time (with --device cpu)")
    where.add_argument("--slurm", action="store_true", help="one SLURM job per run through submitit")
    where.add_argument(
        "--submitit-local", action="store_true", help="submitit's local executor (to try the SLURM path)"
    )
    p.add_argument("--partition", help="SLURM partition (--slurm)")
    p.add_argument("--time", type=int, default=60, help="minutes per job before submitit requeues it (default 60)")
    p.add_argument("--array-parallelism", type=int, default=32, help="SLURM jobs running at once (default 32)")
    p.add_argument(
        "--no-wait", action="store_true", help="submit and exit (--slurm); collect with `python -m ablations results`"
    )
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    own, run_argv = parse_args(argv)
    try:
        gpus = [g.strip() for g in own.gpus.split(",")] if own.gpus else []
        if not all(g.isdigit() for g in gpus):  # checked before the data is read: fail fast
            raise ValueError(f"--gpus {own.gpus!r}: give GPU indices such as 0,1,2,3")
        if own.workers is not None and own.workers < 1:
            raise ValueError(f"--workers {own.workers}: give at least 1")
        request, jobs = split(run_argv)
        data = warm_cache(request)
        log_dir = request.runs / "logs" / request.budget.name
        # The jobs' device: a GPU on a SLURM node even when this login node has none.
        device = torch.device("cuda") if own.slurm and request.device_name != "cpu" else request.device
        if gpus or own.workers is not None:
            with graceful_stops():
                codes = run_local(jobs, gpus or [None] * own.workers, log_dir)
        else:
            try:
                from ablations.grid.slurm import submit  # submitit is an optional extra
            except ModuleNotFoundError as exc:
                raise ValueError(f"{exc.name} is not installed; install the extra: pip install -e '.[slurm]'") from None
            codes = submit(
                jobs,
                log_dir,
                local=own.submitit_local,
                partition=own.partition,
                minutes=own.time,
                parallelism=own.array_parallelism,
                wait=not own.no_wait,
            )
            if codes is None:
                return 0
        text, complete = summary(request, jobs, data, device, codes)
    except options.FORESEEN as exc:
        return options.failed(exc)
    except Stopped as stop:  # passed on to the runs under way by run_local: each saved a checkpoint
        print(
            f"{stop}; no new run is started, finished runs are kept; resume with: python -m ablations.grid.fanout "
            f"{shlex.join(argv if argv is not None else sys.argv[1:])}",
            file=sys.stderr,
        )
        return stop.exit_status
    print(text)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
