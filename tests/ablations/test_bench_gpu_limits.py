"""The GPU benchmark under its time limit, on the CPU: the clock starts when the data is ready, eager rows come before
any compile, a compile is made once or not started, the alarm cuts whatever runs, and the report on disk is always
this run's, complete or marked with how far it got."""

import glob
import json
import os
import signal
import time

import pytest
import torch

from ablations.bench.gpu import __main__ as gpu
from ablations.bench.gpu.report import Progress
from ablations.bench.gpu.timing import (
    MEASURED,
    TIME_UP,
    WARMED,
    Deadline,
    Entry,
    build_entries,
    measure_compiled,
    time_steps,
    training_rows,
)
from ablations.data.batching import make_batch
from ablations.grid.prepared import load_prepared, save_prepared
from ablations.grid.runner import prepare_data
from ablations.runs.budgets import budget
from ablations.training.compiling import compiles
from model import TransformerConfig
from tests.helpers import REAL_DATA, needs_data

CPU = torch.device("cpu")
CFG = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=50)
# Three shapes; the first's source and target lengths match (3 and 2 + BOS), which must not tie them in a compile.
SHAPES = [
    make_batch([[5, 6, 3]] * 2, [[7, 8]] * 2),
    make_batch([[5, 6, 7, 8, 9, 3]] * 3, [[7, 8, 9, 10]] * 3),
    make_batch([[5, 6, 7, 8, 9, 4, 5, 3]] * 5, [[7, 8, 9, 10, 11, 12, 13]] * 5),
]
COMPILE_WARNING = "ignore:Dynamo does not know how to trace"  # the CPU's attention kernel: a graph break


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A prepared folder of the smoke budget (the tiny size's), so that each run reads no corpus."""
    if not REAL_DATA.is_dir():
        pytest.skip("needs the data folder")
    folder = tmp_path_factory.mktemp("prepared")
    save_prepared(prepare_data(budget("smoke"), "multi30k", REAL_DATA, folder / "runs"), folder, "smoke")
    return folder


def bench(tmp_path, prepared, *extra: str) -> int:
    argv = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--decode-sentences", "2", "--decode-reps", "1"]
    argv += ["--data", str(REAL_DATA), "--runs", str(tmp_path / "runs"), "--prepared", str(prepared)]
    return gpu.main([*argv, "--out", str(tmp_path / "bench-gpu.md"), *extra])


def report(tmp_path) -> dict:
    return json.loads((tmp_path / "bench-gpu.json").read_text())


def children() -> list[str]:
    """This process's child processes (from /proc: psutil is not a dependency)."""
    return [pid for f in glob.glob(f"/proc/{os.getpid()}/task/*/children") for pid in open(f).read().split()]


@pytest.mark.slow
@pytest.mark.serial
@needs_data
def test_the_time_limit_counts_from_when_the_data_is_ready(tmp_path, prepared, monkeypatch):
    # A fake clock, not a sleep: reading the data "takes" 1000 s, twice the limit, and the limit leaves 500 s for
    # steps that take well under one, so the verdict is the same on an idle machine and a loaded one.
    real, offset = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    def slow_load(folder, name):
        offset[0] += 1000.0  # as reading a corpus and training a BPE would take, here longer than the limit
        return load_prepared(folder, name)

    monkeypatch.setattr(gpu, "load_prepared", slow_load)
    assert bench(tmp_path, prepared, "--systems", "reference", "--time-limit", "500") == 0
    measured = report(tmp_path)
    assert measured["prepare_s"] >= 1000 and measured["training"][0]["status"] == MEASURED
    assert "Data ready after 1000" in (tmp_path / "bench-gpu.md").read_text()


@needs_data
def test_an_earlier_report_is_replaced_by_a_started_one_before_the_data_is_read(tmp_path, prepared, monkeypatch):
    (tmp_path / "bench-gpu.json").write_text(json.dumps({"status": "complete", "training": [{"system": "old"}]}))
    (tmp_path / "bench-gpu.md").write_text("an earlier run's report\n")
    seen = []

    def load(folder, name):
        seen.append((report(tmp_path), (tmp_path / "bench-gpu.md").read_text()))
        return load_prepared(folder, name)

    monkeypatch.setattr(gpu, "load_prepared", load)
    assert bench(tmp_path, prepared, "--systems", "reference") == 0
    ((started, text),) = seen
    assert started["status"] == "started" and started["training"] == [] and started["started_at"]
    assert "**Started**, nothing measured yet" in text and "an earlier run" not in text


@needs_data
def test_the_report_is_rewritten_after_every_stage_and_eager_rows_and_beam_search_precede_any_compile(
    tmp_path, prepared, monkeypatch
):
    stages, write = [], Progress.write

    def spy(self, status, stage=""):
        write(self, status, stage)
        stages.append((status, stage, report(tmp_path)))  # read back whole: written atomically

    monkeypatch.setattr(Progress, "write", spy)
    argv = ["--systems", "reference,torch-nn", "--modes", "eager,compiled", "--compile-backend", "eager"]
    assert bench(tmp_path, prepared, *argv, "--time-limit", "100", "--compile-estimate", "1000") == 0
    assert [s[:2] for s in stages] == [
        ("started", "reading the data"),
        ("partial", "after reading the data"),
        ("partial", "after the warm-up of reference, eager, default (tiny)"),
        ("partial", "after the warm-up of torch-nn, eager, default (tiny)"),
        ("partial", "after the eager timed steps (tiny)"),
        ("partial", "after profiling the reference's eager step (tiny)"),
        ("partial", "after the beam searches (tiny)"),
        ("partial", "after the building of the compiled entries (tiny)"),
        ("partial", "after the reference compiled skipped (tiny)"),
        ("partial", "after the torch-nn compiled skipped (tiny)"),
        ("partial", "after profiling the reference's compiled step (tiny)"),
        ("complete", ""),
    ]
    before_compiles = stages[6][2]
    assert [r["status"] for r in before_compiles["training"]] == [MEASURED, MEASURED]
    assert before_compiles["decoding"][0]["status"] == MEASURED
    compiled = [r for r in report(tmp_path)["training"] if r["mode"] == "compiled"]
    assert [r["status"][:38] for r in compiled] == ["not measured: no room for its compile "] * 2
    eager, compiled = report(tmp_path)["profiles"]
    assert eager["status"] == MEASURED and eager["rows"] and before_compiles["profiles"] == [eager]
    assert compiled["status"].startswith("not profiled: not measured: no room for its compile")


def test_a_compile_the_time_left_cannot_hold_is_skipped_not_started():
    entries, _, _ = build_entries(CFG, ("reference",), ("compiled",), "default", (), CPU, None, "eager")
    graphs = compiles()
    measure_compiled(entries, SHAPES, 1, CPU, Deadline(30.0), estimate_s=60.0, eager_s={"reference": 5.0})
    assert compiles() == graphs and entries[0].warmup_s == 0
    assert entries[0].status.startswith("not measured: no room for its compile (30 s left, 65 s needed)")


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.filterwarnings(COMPILE_WARNING)
def test_a_compiled_entry_compiles_once_for_every_batch_shape():
    entries, _, _ = build_entries(CFG, ("torch-nn",), ("compiled",), "default", (), CPU, None, "eager")
    measure_compiled(entries, SHAPES, 2, CPU, Deadline(None), estimate_s=60.0, eager_s={})
    (row,) = training_rows("tiny", entries, peak=None)
    assert row["warmup_compiles"] > 0 and row["warmup_compiling_steps"] == 1  # two shapes, one compile
    assert row["status"] == MEASURED and row["timed_steps"] == 1 and row["timed_compiling_steps"] == 0


@pytest.mark.serial
def test_a_timed_step_still_running_at_the_time_limit_is_cut_and_the_steps_before_it_stand():
    naps = iter([0.0, 0.0, 30.0])
    entry = Entry("reference", "eager", "default", CFG, {"encoder": 1, "decoder": 1, "total": 2}, lambda b: None)
    entry.step, entry.status = (lambda batch: time.sleep(next(naps))), WARMED
    started = time.perf_counter()
    assert time_steps([entry], SHAPES, CPU, Deadline(1.0)) == 2
    assert time.perf_counter() - started < 20  # cut at 1 s, far from the 30 s the step would sleep
    assert entry.status == MEASURED and len(entry.times) == 2


@pytest.mark.serial
@needs_data
def test_sigterm_writes_what_was_measured_before_the_process_exits(tmp_path, prepared, monkeypatch, capsys):
    def terminated(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # as the GPU check sends at its part's limit

    monkeypatch.setattr(gpu, "time_decoding", terminated)
    assert bench(tmp_path, prepared, "--systems", "reference") == 128 + signal.SIGTERM
    stopped = report(tmp_path)
    assert stopped["status"] == "stopped" and stopped["stage"] == "stopped by SIGTERM"
    assert stopped["training"][0]["status"] == MEASURED and stopped["training"][0]["timed_steps"] == 2
    assert "**Stopped**" in (tmp_path / "bench-gpu.md").read_text()
    assert "the report holds what was measured before the stop" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.serial
@needs_data
@pytest.mark.filterwarnings(COMPILE_WARNING)
def test_a_compile_abandoned_at_the_time_limit_leaves_the_eager_rows_and_no_compile_workers(tmp_path, prepared):
    # An empty inductor cache: the kernels that earlier runs of this test compiled before the limit cut them are
    # cached on disk, and once enough of them are, a compile would finish inside the limit.
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    argv = ["--systems", "torch-nn", "--modes", "eager,compiled", "--compile-backend", "inductor"]
    with temporary_cache_dir(str(tmp_path / "inductor-cache")):
        assert bench(tmp_path, prepared, *argv, "--compile-estimate", "0", "--time-limit", "4") == 0
    eager, compiled = report(tmp_path)["training"]
    assert eager["status"] == MEASURED and eager["timed_steps"] == 2
    assert compiled["status"] == TIME_UP and compiled["timed_steps"] == 0
    assert children() == []
