"""One SLURM job per run through submitit (the optional extra: pip install '.[slurm]').

Each job calls the runner's own entry point, `python -m ablations run --rows ROW --seeds SEED ...`, on
one GPU. A job that reaches its time limit or is preempted is requeued by submitit (Checkpointable)
and resumes from the run's checkpoint; results land in the shared runs folder like any other run's.
"""

from __future__ import annotations

from pathlib import Path

import submitit
import torch

from ablations.__main__ import main as runner_main
from ablations.runs.jobs import Job


class RunJob(submitit.helpers.Checkpointable):
    """`python -m ablations ARGV` as a job; on timeout or preemption submitit submits it again with the same ARGV."""

    def __call__(self, argv: list[str]) -> int:
        return runner_main(argv)


def executor(folder: Path, local: bool, partition: str | None, minutes: int, parallelism: int) -> submitit.AutoExecutor:
    """A SLURM executor asking one GPU per job (or submitit's local executor, which runs the jobs as processes here)."""
    ex = submitit.AutoExecutor(folder=folder, cluster="local" if local else "slurm")
    gpus = min(1, torch.cuda.device_count()) if local else 1
    ex.update_parameters(
        name="aiayn-ablations",
        timeout_min=minutes,
        nodes=1,
        tasks_per_node=1,
        gpus_per_node=gpus,
        cpus_per_task=None if local else 8,
        slurm_partition=partition,
        slurm_array_parallelism=parallelism,
    )
    return ex


def submit(
    jobs: list[Job],
    folder: Path,
    local: bool = False,
    partition: str | None = None,
    minutes: int = 60,
    parallelism: int = 32,
    wait: bool = True,
) -> dict[str, int] | None:
    """Submit one job per run as a job array; wait for them and return each one's exit status, or None with wait=False."""
    ex = executor(folder, local, partition, minutes, parallelism)
    with ex.batch():
        submitted = [ex.submit(RunJob(), list(job.argv)) for job in jobs]
    print(f"submitted {len(submitted)} job(s) ({'local' if local else 'slurm'}); logs in {folder}")
    if not wait:
        for job, sub in zip(jobs, submitted):
            print(f"  {job.name}: job {sub.job_id}")
        return None
    codes = {}
    for job, sub in zip(jobs, submitted):
        try:
            codes[job.name] = sub.result()
        except (
            submitit.core.utils.UncompletedJobError
        ) as exc:  # failed, killed, or out of requeues: the summary says so
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            print(f"  {job.name}: job {sub.job_id} did not complete ({last})")
            codes[job.name] = -1
    return codes
