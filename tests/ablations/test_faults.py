"""Faults a grid that runs for days must survive: SIGKILL, broken checkpoints, half-written results, OOM, divergence."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from ablations.__main__ import main
from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS
from ablations.runs.folder import previous_checkpoint
from ablations.training.checkpoints import TrainState, resume, save_checkpoint
from ablations.training.train import make_optimizer
from model import Transformer, TransformerConfig
from tests.helpers import (
    REPO,
    STEPS,
    ablations_argv,
    environment,
    logged,
    needs_data,
    only_run,
    result,
    run_ablations,
    run_ablations_forked,
    runs_folder,
    smoke_cache,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return smoke_cache(tmp_path_factory)


FIRST_CHECKPOINT = BUDGETS["smoke"].checkpoint_every  # 8

# --- SIGKILL at a random step -------------------------------------------------------------------------------------


def kill_at_step(runs, step: int) -> int:
    """Start a run and SIGKILL it once its progress bar shows `step` or later; returns the step it showed."""
    command = [sys.executable, "-m", "ablations", *ablations_argv(runs)]
    proc = subprocess.Popen(command, cwd=REPO, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen, shown = b"", 0
    while shown < step:
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"the run ended before step {step}: {seen[-2000:].decode(errors='replace')}"
        seen += chunk
        shown = max([shown, *map(int, re.findall(rb"(\d+)/%d \[" % STEPS, seen[-8192:]))])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return shown


@needs_data
@pytest.mark.slow
@pytest.mark.serial
def test_a_run_killed_at_a_random_step_resumes_to_the_uninterrupted_result(tmp_path, cache):
    whole = runs_folder(tmp_path / "whole", cache)
    code, output = run_ablations_forked(whole)  # the uninterrupted run to compare with: forked, not a fresh interpreter
    assert code == 0, output[-3000:]
    step = random.Random().randint(
        FIRST_CHECKPOINT + 1, STEPS - 1
    )  # past the first checkpoint: resumption is exercised
    killed = runs_folder(tmp_path / "killed", cache)
    shown = kill_at_step(killed, step)
    directory = only_run(killed)
    assert R.status(directory) != "finished"
    resumed = run_ablations(killed)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"base s1: resuming from checkpoint(\.prev)?\.pt at step (8|12)\n", resumed.stderr), (
        resumed.stderr[-3000:]
    )
    # Exact: the checkpoint restores weights, Adam's moments, the RNG and the batch stream's position, and both runs
    # use one CPU thread, so the resumed run repeats the uninterrupted run's arithmetic operation for operation.
    context = f"killed at step {shown} (aimed at {step})"
    assert logged(directory) == logged(only_run(whole)), context
    assert result(directory) == result(only_run(whole)), context


# --- checkpoints: checksum, the previous one kept -----------------------------------------------------------------

TINY = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=30, max_len=32, P_drop=0.0)


def two_checkpoints(tmp_path):
    """A run folder with checkpoints at step 1 (previous) and step 2 (latest); returns the latest's path."""
    model = Transformer(TINY)
    optimizer = make_optimizer(model, torch.device("cpu"))
    path = tmp_path / R.CHECKPOINT
    for step in (1, 2):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        save_checkpoint(path, model, optimizer, TrainState(step=step, tokens_seen=10 * step))
    return path


def fresh():
    model = Transformer(TINY)
    return model, make_optimizer(model, torch.device("cpu"))


def test_saving_keeps_the_latest_two_checkpoints(tmp_path):
    path = two_checkpoints(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, previous_checkpoint(path).name])
    assert resume(tmp_path, *fresh()).step == 2


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "emptied"])
def test_a_damaged_checkpoint_is_detected_and_the_previous_one_used(tmp_path, damage, capsys):
    path = two_checkpoints(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped byte":
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    model, optimizer = fresh()
    state = resume(tmp_path, model, optimizer)
    assert state == TrainState(step=1, tokens_seen=10)
    assert "fails its checksum" in capsys.readouterr().err


def test_with_no_intact_checkpoint_the_run_starts_over_and_says_so(tmp_path, capsys):
    path = two_checkpoints(tmp_path)
    for p in (path, previous_checkpoint(path)):
        p.write_bytes(p.read_bytes()[:-100])
    model, optimizer = fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert resume(tmp_path, model, optimizer) == TrainState()
    assert "starting from step 0" in capsys.readouterr().err
    for name, value in model.state_dict().items():  # a damaged file is checked before anything is loaded from it
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


# --- results: never half-written, never read as finished ----------------------------------------------------------

FINISHED = {"row": "base", "seed": 1, "status": "finished", "error": None, "dev_ppl": 12.5, "bleu": 20.0}


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_a_half_written_final_json_is_never_read_as_finished(tmp_path, fraction):
    directory = tmp_path / "smoke" / "base-s1-00000000"
    directory.mkdir(parents=True)
    text = json.dumps(FINISHED, indent=2)
    (directory / R.FINAL).write_text(text[: int(len(text) * fraction)])
    assert R.status(directory) == "new"
    assert R.results_table(tmp_path).empty


WRITER = """
import sys
from pathlib import Path
from ablations.runs import folder as R
path, n = Path(sys.argv[1]), 0
print("ready", flush=True)
while True:  # two complete versions of a large final.json, written over each other until killed
    n += 1
    R.write_json(path, {"status": "finished", "version": n % 2, "padding": "x" * 2_000_000})
"""


@pytest.mark.slow
@pytest.mark.serial
def test_a_final_json_rewritten_or_killed_mid_write_always_reads_complete(tmp_path):
    path = tmp_path / R.FINAL
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], cwd=REPO, env=environment(), stdout=subprocess.PIPE
    )
    assert proc.stdout.readline() == b"ready\n"
    while not path.exists():
        time.sleep(0.001)
    reads, deadline = 0, time.monotonic() + random.uniform(0.3, 0.6)
    while time.monotonic() < deadline:  # read while it is being rewritten: never a partial file
        final = R.read_json(path)
        assert final is not None and len(final["padding"]) == 2_000_000, f"a partial final.json at read {reads}"
        reads += 1
    proc.send_signal(signal.SIGKILL)  # and killed at a random moment of a write
    proc.wait(timeout=30)
    proc.stdout.close()
    final = R.read_json(path)
    assert final is not None and final["status"] == "finished" and len(final["padding"]) == 2_000_000
    assert R.status(tmp_path) == "finished"


# --- out of memory and divergence: recorded, and the grid goes on -------------------------------------------------


class FaultyModel(Transformer):
    """The reference model with a fault chosen by its depth: C1 (N=2) runs out of GPU memory, C3 (N=8) hits
    the RuntimeError that older torch versions raise for it, C2 (N=4) diverges; any other row trains normally."""

    def forward(self, src, tgt, src_pad, tgt_pad):
        if self.config.N == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.config.N == 8:
            raise RuntimeError("CUDA error: out of memory")
        logits = super().forward(src, tgt, src_pad, tgt_pad)
        return logits * float("nan") if self.config.N == 4 else logits


def faulty_model(config: TransformerConfig) -> nn.Module:
    return FaultyModel(config)


@needs_data
@pytest.mark.slow
def test_rows_that_run_out_of_memory_or_diverge_are_recorded_and_the_grid_goes_on(tmp_path, cache, capsys):
    runs = runs_folder(tmp_path, cache)
    code = main(
        [
            "run",
            "--budget",
            "smoke",
            "--rows",
            "C1,C2,C3,base",
            "--steps",
            "2",
            "--dev-pairs",
            "20",
            "--device",
            "cpu",
            "--runs",
            str(runs),
            "--model",
            "tests.ablations.test_faults:faulty_model",
            "--max-attempts",
            "1",
        ]
    )
    assert code == 1  # some rows failed
    finals = {f["row"]: f for f in map(R.read_json, (runs / "smoke").glob(f"*/{R.FINAL}"))}
    assert {row: f["status"] for row, f in finals.items()} == {
        "C1": "failed",
        "C2": "diverged",
        "C3": "failed",
        "base": "finished",
    }
    assert finals["C1"]["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert finals["C3"]["error"] == "RuntimeError: CUDA error: out of memory"
    assert "diverged at step 2" in finals["C2"]["error"]  # the loss is read back at logging and checkpoint steps
    assert finals["base"]["dev_ppl"] is not None
    closing = capsys.readouterr().err.split("\n")
    summary = "\n".join(closing[next(i for i, line in enumerate(closing) if line.startswith("4 runs:")) :])
    assert "4 runs: 1 finished, 1 diverged, 2 failed" in summary
    assert re.search(
        r"C1 s1 failed: OutOfMemoryError: CUDA out of memory\. Tried to allocate 2\.00 GiB.*--accumulation", summary
    )
    assert re.search(r"C2 s1 diverged: training diverged at step 2", summary)
    assert re.search(r"C3 s1 failed: RuntimeError: CUDA error: out of memory", summary)
