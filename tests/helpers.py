"""What several test modules share: the repository's root, the data folder and its skip mark, hypothesis settings
for a few examples, and helpers for tests that run `python -m ablations` (or torchrun) as real processes on the
smoke budget. Fixtures live beside it in conftest.py.

The smoke budget's BPE is trained once per test run (`smoke_cache`, shared by the xdist workers) and copied into each
test's runs folder, so that every process finds it cached. One thread per process: the runs are bitwise reproducible
on CPU with a fixed thread count, and the two cores of CI are shared by the processes of a test.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from filelock import FileLock
from hypothesis import settings

from ablations.data.corpora import ENV_VAR
from ablations.grid.runner import prepare_data
from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS
from ablations.training.train import make_optimizer

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(
    os.environ.get(ENV_VAR) or REPO.parent / "shared" / "data"
)  # where the tools look: $AIAYN_DATA, else ../shared/data
NO_DATA = f"needs the data folder: set {ENV_VAR} or put it at ../shared/data"
needs_data = pytest.mark.skipif(not REAL_DATA.is_dir(), reason=NO_DATA)


def needs_cuda(test: Callable) -> Callable:
    """A test that runs only where CUDA is: marked `cuda`, which the GPU check runs first (-m cuda), skipped elsewhere."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


# Training steps of the CLI tests: logs at 4, 8, 12, checkpoints at 8 and 12, dev perplexity at 12 (smoke budget).
STEPS = 12
DEV_PAIRS = 20  # scored for PPL and BLEU: beam search over the budget's 100 would take most of a test's time


def doc_block(first_line: str, page: str = "plugging-in.md") -> str:
    """The code block of docs/PAGE whose first line starts with first_line: what a user copies from the docs."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", (REPO / "docs" / page).read_text(), flags=re.S | re.M)
    return next(block for block in blocks if block.startswith(first_line))


def few(examples: int = 3) -> settings:
    """Hypothesis settings that draw `examples` cases: enough to run a property on a small model, not to search it."""
    return settings(settings.default, max_examples=examples)


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "AIAYN_DATA": str(REAL_DATA), "PYTHONPATH": str(REPO)}


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this test run that every xdist worker sees: the workers' temporary roots are children of the run's."""
    root = tmp_path_factory.getbasetemp()
    return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / name


def smoke_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder's cache/ holding the smoke budget's BPE, trained once per test run by the first test (of any module,
    in any xdist worker) that asks; the others wait on the lock, then find it. Read it only: runs_folder copies it."""
    runs = shared_folder(tmp_path_factory, "smoke-bpe")
    with FileLock(f"{runs}.lock"):
        if not (runs / "complete").is_file():
            shutil.rmtree(runs, ignore_errors=True)  # what a stopped build left
            prepare_data(BUDGETS["smoke"], "multi30k", REAL_DATA, runs)
            (runs / "complete").touch()
    return runs / "cache"


def runs_folder(tmp: Path, cache: Path) -> Path:
    """A fresh runs folder with the cached BPE in it."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cache, tmp / "cache")
    return tmp


def ablations_argv(
    runs: Path, rows: str = "base", *extra: str, steps: int = STEPS, dev_pairs: int = DEV_PAIRS
) -> list[str]:
    """`python -m ablations run` of the smoke budget on the CPU, shortened to steps and dev_pairs."""
    return [
        "run",
        "--budget",
        "smoke",
        "--rows",
        rows,
        "--steps",
        str(steps),
        "--dev-pairs",
        str(dev_pairs),
        "--device",
        "cpu",
        "--runs",
        str(runs),
        *extra,
    ]


def run_ablations(
    runs: Path, rows: str = "base", *extra: str, launcher: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """`python -m ablations run ...` (or under a launcher such as torchrun) on the smoke budget; output captured."""
    command = [*(launcher or (sys.executable,)), "-m", "ablations", *ablations_argv(runs, rows, *extra)]
    return subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=300)


FORK = multiprocessing.get_context("fork")


def _ablations_here(argv: list[str], log: str) -> None:
    """`python -m ablations ARGV` in a forked child, as run_ablations starts it (working directory, environment), its
    output into log."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout, sys.stderr = os.fdopen(1, "w", buffering=1), os.fdopen(2, "w", buffering=1)
    os.chdir(REPO)
    os.environ.update({k: v for k, v in environment().items() if k != "PYTHONPATH"})
    from ablations.__main__ import main

    sys.exit(main(argv))


def run_ablations_forked(runs: Path, rows: str = "base", *extra: str) -> tuple[int, str]:
    """`python -m ablations run ...` as run_ablations runs it, in a process forked from this one: a real process of
    its own (pid, signal handlers, one thread), without the 4-6 s of CPU a fresh interpreter spends importing torch
    and the runner. For a run that a test compares against, not for the process under test. Returns its exit code
    and its output."""
    make_optimizer(torch.nn.Linear(1, 1), torch.device("cpu"))  # what Adam imports (torch._dynamo), once, not per fork
    log = runs.parent / f"{runs.name}.log"
    child = FORK.Process(target=_ablations_here, args=(ablations_argv(runs, rows, *extra), str(log)))
    child.start()
    child.join(timeout=300)
    return child.exitcode, log.read_text(errors="replace")


def only_run(runs: Path, seed: str = "") -> Path:
    """The one run directory under a runs folder (with `-s<seed>-` in its name, if given)."""
    found = [p.parent for p in (runs / "smoke").glob(f"*{seed and f'-{seed}-'}*/{R.CONFIG}")]
    assert len(found) == 1, f"expected one run under {runs}, found {found}"
    return found[0]


def logged(directory: Path, keys: tuple[str, ...] = ("step", "loss", "lr", "dev_ppl")) -> list[dict]:
    """metrics.jsonl without the timing fields, which differ between any two runs."""
    return [
        {k: r[k] for k in keys if k in r} for r in map(json.loads, (directory / R.METRICS).read_text().splitlines())
    ]


RESULT_KEYS = ("status", "dev_ppl", "bleu", "bleu_tokenized", "params", "steps", "tokens_seen")


def result(directory: Path) -> dict:
    """final.json without provenance and timing."""
    final = R.read_json(directory / R.FINAL)
    assert final is not None, f"no final.json in {directory}"
    return {k: final[k] for k in RESULT_KEYS}
