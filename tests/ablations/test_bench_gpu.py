"""The GPU benchmark on the CPU: what it reports and how it fails (no GPU here, so no speed is asserted; the same code
runs with --device cuda on one). Its time limit and its reports' life: test_bench_gpu_limits.py; the GPU check's
tests: test_gpu_check.py."""

import json
import time

import pytest
import torch

from ablations.bench.gpu import __main__ as gpu
from ablations.bench.gpu import options as gpu_options
from ablations.bench.gpu import timing
from ablations.bench.gpu.profiling import ROWS, profile_entry
from ablations.bench.gpu.report import profile_tables
from ablations.bench.gpu.timing import (
    MEASURED,
    SYSTEMS,
    TIME_UP,
    WARMED,
    Clocked,
    Deadline,
    Entry,
    build_entries,
    clocked_step,
    percentiles,
    read_clock,
    time_steps,
    training_rows,
    warm_up,
)
from ablations.training.backends import SDPA_BACKENDS
from ablations.training.clock import Laps, StepClock
from ablations.data.batching import make_batch
from model import TransformerConfig
from tests.helpers import REAL_DATA, needs_data

CFG = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=50)
COUNTS = {"encoder": 100, "decoder": 100, "total": 200}
BATCHES = [make_batch([[5, 6, 3]] * 2, [[7, 8]] * 2) for _ in range(3)]


def entry(backend: str, step) -> Entry:
    return Entry("reference", "eager", backend, CFG, COUNTS, step)


def no_kernel(batch):
    raise RuntimeError("No available kernel. Aborting execution.\nmore lines of torch's explanation")


@needs_data
@pytest.mark.slow
def test_the_cpu_path_reports_every_system_with_step_time_percentiles_and_beam_search(tmp_path):
    out = tmp_path / "bench-gpu.md"
    argv = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--decode-sentences", "2", "--decode-reps", "1"]
    argv += ["--backends", "cudnn", "--data", str(REAL_DATA), "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert gpu.main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["status"] == "complete" and report["prepare_s"] > 0
    rows = {(r["system"], r["backend"]): r for r in report["training"]}
    for system in SYSTEMS:
        row = rows[system, "default"]
        assert row["status"] == "measured" and row["timed_steps"] == 2 and row["tgt_tokens_per_s"] > 0
        assert 0 < row["step_s_p50"] <= row["step_s_p99"] <= row["step_s_max"]
        assert row["mfu"] is None  # fp32 on a CPU: nothing to hold it to
    # The CPU has no cuDNN attention: the peers that call torch's attention raise there, and say so.
    assert rows["torch-nn", "cudnn"]["status"].startswith("unsupported: RuntimeError")
    assert [d["system"] for d in report["decoding"]] == ["reference beam_search", "HF MarianMT generate"]
    assert all(d["s"] > 0 and d["output_tokens"] > 0 for d in report["decoding"])
    text = out.read_text()
    assert "MFU not reported" in text and "Regenerate: `python -m ablations.bench.gpu --device cpu" in text


def test_a_backend_that_raises_is_reported_unsupported_and_the_others_are_still_timed():
    entries = [entry("default", lambda b: None), entry("flash", no_kernel)]
    warm_up(entries, BATCHES[:1], torch.device("cpu"), Deadline(None))
    assert time_steps(entries, BATCHES[1:], torch.device("cpu"), Deadline(None)) == 2
    measured, flash = training_rows("tiny", entries, peak=None)
    assert measured["status"] == "measured" and measured["timed_steps"] == 2 and measured["step_s_max"] is not None
    assert flash["status"] == "unsupported: RuntimeError: No available kernel. Aborting execution. (in warm-up)"
    assert flash["tgt_tokens_per_s"] is None and flash["step_s_p50"] is None


def test_an_error_under_torchs_own_backend_choice_is_a_failure_not_unsupported():
    entries = [entry("default", no_kernel)]
    warm_up(entries, BATCHES[:1], torch.device("cpu"), Deadline(None))
    assert training_rows("tiny", entries, peak=None)[0]["status"].startswith("failed: RuntimeError")


def test_a_warm_up_still_running_when_the_time_limit_comes_is_abandoned_and_said_so():
    started = time.perf_counter()
    entries = [entry("default", lambda b: time.sleep(60))]
    warm_up(entries, BATCHES[:1], torch.device("cpu"), Deadline(1.0))
    assert time.perf_counter() - started < 30  # cut at 1 s, far from the 60 s the warm-up would sleep
    assert entries[0].status == TIME_UP


# The two tests that compile the tiny reference run on one xdist worker, one after the other: tracing it (14 graph breaks
# at the CPU's attention kernel) takes about 20 s of CPU, and the second finds dynamo's cache of the first's graphs.
SAME_COMPILE = pytest.mark.xdist_group("bench_gpu_compiled")


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")  # the CPU's attention kernel: a graph break
@pytest.mark.slow
@SAME_COMPILE
def test_a_compiled_entry_counts_its_compiling_in_warm_up_apart_from_its_timed_steps():
    entries, models, notes = build_entries(
        CFG, ("reference",), ("eager", "compiled"), "default", (), torch.device("cpu"), None, compile_backend="eager"
    )
    assert [(e.mode, e.backend) for e in entries] == [("eager", "default"), ("compiled", "default")] and not notes
    warm_up(entries, BATCHES[:1], torch.device("cpu"), Deadline(None))
    time_steps(entries, BATCHES[1:], torch.device("cpu"), Deadline(None))  # the warm-up's shape again
    eager, compiled = training_rows("tiny", entries, peak=None)
    assert eager["warmup_compiles"] == 0 and compiled["warmup_compiles"] > 0
    assert compiled["timed_steps"] == 2 and compiled["timed_compiling_steps"] == 0
    assert list(models) == ["reference"]


def test_p99_of_fewer_than_100_steps_is_the_largest_and_p50_the_median():
    assert percentiles([0.3, 0.1, 0.2, 0.9]) == {"p50": 0.25, "p99": 0.9, "max": 0.9}
    assert percentiles([]) == {"p50": None, "p99": None, "max": None}


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "error: --device 'tpu': give auto, cpu, cuda or cuda:N"),
        pytest.param(
            ["--device", "cuda"], "error: --device cuda: no CUDA device is available; use --device cpu", marks=NO_CUDA
        ),
        (["--device", "cpu", "--sizes", "huge"], "error: --sizes 'huge': choose from base, big, tiny"),
        (["--device", "cpu", "--backend", "fast"], "error: --backend 'fast': choose from default, cudnn,"),
        (["--device", "cpu", "--compile-estimate", "-1"], "error: --compile-estimate -1.0: give a number of seconds"),
    ],
)
def test_a_bad_flag_is_one_line_naming_the_problem_and_the_fix(argv, message, capsys, tmp_path):
    assert gpu.main([*argv, "--out", str(tmp_path / "report.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_other_attention_backends_are_timed_only_on_request(tmp_path):
    out = ["--device", "cpu", "--out", str(tmp_path / "report.md"), "--data", str(tmp_path)]  # any folder: not read
    assert gpu_options.parse(out).backends == ()
    assert gpu_options.parse([*out, "--backends", "cudnn,math"]).backends == ("cudnn", "math")
    assert gpu_options.parse([*out, "--backends", "all"]).backends == SDPA_BACKENDS


def test_the_compiled_entries_the_targets_compare_compile_first():
    assert gpu.compiled_order(tuple(SYSTEMS)) == ("reference", "hf-marian", "torch-nn")
    assert gpu.compiled_order(("torch-nn", "reference")) == ("reference", "torch-nn")


class FakeClock:
    """A StepClock whose steps take 1, 2, 3... seconds, and that counts its marks."""

    made: list = []

    def __init__(self, device):
        self.marks, self.laps = 0, []
        FakeClock.made.append(self)

    def start(self):
        self.marks += 1

    def lap(self, graphs=0, tokens=0):
        self.laps.append((float(len(self.laps) + 1), graphs, tokens))

    def read(self):
        laps = Laps()
        for seconds, graphs, tokens in self.laps:
            (laps.compiling if graphs else laps.steps).append(seconds)
            laps.steady_tokens += 0 if graphs else tokens
        self.laps = []
        return laps


def test_timed_steps_are_clocked_as_the_runner_clocks_its_own_with_no_wait_between_steps(monkeypatch):
    FakeClock.made = []
    monkeypatch.setattr(timing, "StepClock", FakeClock)
    entries = [entry("default", lambda b: None), entry("math", lambda b: None)]
    for e in entries:
        e.status = WARMED

    def no_wait(device):
        raise AssertionError("a timed step waited for the device")

    monkeypatch.setattr(timing, "synced", no_wait)
    assert time_steps(entries, BATCHES, torch.device("cpu"), Deadline(None)) == 3
    assert [c.marks for c in FakeClock.made] == [3, 3]  # one clock per entry, every step marked on it
    for e in entries:
        assert e.status == MEASURED and e.times == [1.0, 2.0, 3.0]  # the clock's times, read once the steps are done
        assert e.tgt_tokens == 3 * BATCHES[0].tgt_tokens


def test_a_step_the_alarm_cut_before_its_lap_is_dropped_and_the_steps_before_it_stand():
    clocked = Clocked(StepClock(torch.device("cpu")))
    e = entry("default", lambda b: None)
    for batch in BATCHES[:2]:
        clocked_step(e, batch, torch.device("cpu"), clocked)
    clocked.steps.append((0, 3, 3))  # a third step recorded, its lap never marked: the alarm rang in between
    read_clock(e, clocked)
    assert len(e.times) == 2 and e.tgt_tokens == 2 * BATCHES[0].tgt_tokens and not clocked.steps


def profiled(mode: str) -> dict:
    entries, _, _ = build_entries(CFG, ("reference",), (mode,), "default", (), torch.device("cpu"), None, "eager")
    warm_up(entries, BATCHES[:1], torch.device("cpu"), Deadline(None))
    time_steps(entries, BATCHES[1:], torch.device("cpu"), Deadline(None))
    return profile_entry(entries[0], "tiny", BATCHES[0], torch.device("cpu"), Deadline(None))


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")  # the CPU's attention kernel: a graph break
@pytest.mark.parametrize("mode", ["eager", pytest.param("compiled", marks=[pytest.mark.slow, SAME_COMPILE])])
def test_a_profiled_step_ranks_its_top_operators_by_self_cpu_time_on_the_cpu(mode):
    record = profiled(mode)
    assert record["status"] == "measured" and record["ranked"] == "operators by self CPU time"
    rows = record["rows"]
    assert 0 < len(rows) <= ROWS and all(r["calls"] >= 1 for r in rows)
    assert [r["self_ms"] for r in rows] == sorted((r["self_ms"] for r in rows), reverse=True)
    assert 0 < sum(r["share"] for r in rows) <= 1 + 1e-9
    assert sum(r["self_ms"] for r in rows) <= record["total_ms"] + 1e-9
    assert record["launches"] >= sum(r["calls"] for r in rows)  # every operator call that did work, not only the top
    table = profile_tables([record])
    assert (
        table[0].startswith(f"One tiny, reference, {mode}, default step (")
        and table[2] == "| name | self ms | share | calls |"
    )
    assert len(table) == 4 + len(rows) + 1


def test_an_entry_without_timed_steps_is_not_profiled_and_says_why():
    e = entry("default", lambda b: None)
    e.status = TIME_UP
    record = profile_entry(e, "tiny", BATCHES[0], torch.device("cpu"), Deadline(None))
    assert record["status"] == f"not profiled: {TIME_UP}" and "rows" not in record
    assert profile_tables([record]) == [f"One tiny, reference, eager, default step: not profiled: {TIME_UP}.", ""]
