"""The GPU benchmark and the GPU check, on the CPU: what they report and how they fail (no GPU here, so no speed is
asserted; the same code runs with --device cuda on one)."""

import dataclasses
import json
import sys
import time

import pytest
import torch

from ablations.bench import gpu, gpu_check
from ablations.bench.gpu_check import CheckOptions, Part, check, runner_lines
from ablations.bench.gpu_timing import (
    SYSTEMS,
    TIME_UP,
    Deadline,
    Entry,
    build_entries,
    percentiles,
    time_steps,
    training_rows,
    warm_up,
)
from ablations.data.batching import make_batch
from ablations.runs import folder as R
from ablations.training.stopping import graceful_stops
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
def test_the_cpu_path_reports_every_system_with_step_time_percentiles_and_beam_search(tmp_path):
    out = tmp_path / "bench-gpu.md"
    argv = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--decode-sentences", "2", "--decode-reps", "1"]
    argv += ["--backends", "cudnn", "--data", str(REAL_DATA), "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert gpu.main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
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
    entries = [entry("default", lambda b: time.sleep(5))]
    warm_up(entries, BATCHES[:1], torch.device("cpu"), Deadline(1.0))
    assert time.perf_counter() - started < 2
    assert entries[0].status == TIME_UP


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")  # the CPU's attention kernel: a graph break
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


def test_the_runner_part_reads_step_times_from_the_logged_windows_and_says_what_was_not_recorded(tmp_path):
    run = tmp_path / "short" / "base-s1-0123abcd"
    run.mkdir(parents=True)
    for step, time_s in [(25, 30.0), (50, 32.5), (75, 35.5)]:  # 30 s of compiling in the first window
        R.append_metrics(run, {"step": step, "loss": 5.0, "tokens_per_s": 1.0, "time_s": time_s})
    R.write_final(run, {"status": "finished", "steps": 75, "tokens_per_s": 12000.0, "mfu": 0.31})
    finals, windows, steps = runner_lines(tmp_path, "short", "base")
    assert "status finished, 75 steps, 12,000 tokens/s, MFU 31.0%" in finals
    assert "graphs compiled not recorded, compiling not recorded" in finals
    assert "p50 110.0 ms, p99 120.0 ms, max 120.0 ms over 2 windows" in windows
    assert "the first (to step 25, where compiling falls) 1200.0 ms" in windows
    assert steps == "per-step times: not recorded in metrics.jsonl"


def test_the_check_writes_its_report_and_a_failing_part_stops_no_other(tmp_path):
    py = sys.executable
    parts = [
        Part("bench", "fails", (py, "-c", "import sys; print('boom'); sys.exit(3)"), 30),
        Part("runner", "hangs", (py, "-c", "import time; time.sleep(60)"), 1),
        Part("torchrun", "not here", (py, "-c", "pass"), 30, skip="skipped: no torchrun"),
        Part("tests", "passes", (py, "-c", "print('3 passed in 0.01s')"), 30),
    ]
    options = CheckOptions("cpu", True, tmp_path, tmp_path, True, tmp_path / "gpu-check.md", (), "--quick")
    meta = {**gpu_check.machine(), "device": "cpu", "python": "3", "transformers": "-", "args": "--quick"}
    started = time.perf_counter()
    outcomes = check(options, parts, meta)
    assert time.perf_counter() - started < 20  # the hanging part was stopped at its limit
    assert [x.result for x in outcomes] == [
        "failed (exit 3)",
        "timed out at its limit of 1 s",
        "skipped: no torchrun",
        "passed",
    ]
    assert "boom" in outcomes[0].tail and outcomes[3].lines == ("3 passed in 0.01s",)
    text = (tmp_path / "gpu-check.md").read_text()
    assert "| bench | fails | 30 s | failed (exit 3) |" in text and "| tests | passes | 30 s | passed |" in text
    assert "- no readable report (FileNotFoundError)" in text and "- no run folder was written" in text
    assert len(json.loads((tmp_path / "gpu-check.json").read_text())["parts"]) == 4


def test_parts_picks_which_parts_run_in_the_checks_own_order(tmp_path):
    argv = ["--device", "cpu", "--quick", "--parts", "tests,runner", "--data", str(tmp_path), "--work", str(tmp_path)]
    options = gpu_check.parse(argv)
    assert [part.name for part in gpu_check.plan(options)] == ["runner", "tests"]


def test_the_tests_part_stopped_at_its_limit_still_names_the_tests_that_failed_before(tmp_path):
    (tmp_path / "test_some.py").write_text(
        "import time\n\ndef test_breaks():\n    assert False\n\ndef test_hangs():\n    time.sleep(60)\n"
    )
    pytest_args = ("-q", "-p", "no:cacheprovider", str(tmp_path / "test_some.py"))
    options = CheckOptions("cpu", True, tmp_path, tmp_path, True, tmp_path / "gpu-check.md", pytest_args, "--quick")
    tests = next(part for part in gpu_check.plan(options) if part.name == "tests")
    meta = {**gpu_check.machine(), "device": "cpu", "python": "3", "transformers": "-", "args": "--quick"}
    with graceful_stops():  # as main runs it: its parts take SIGINT even where this process ignores it (xdist)
        (outcome,) = check(options, [dataclasses.replace(tests, limit_s=gpu_check.GRACE_S + 4)], meta)
    assert outcome.result == f"timed out at its limit of {gpu_check.GRACE_S + 4} s"
    assert "1 failed" in outcome.lines[0]
    assert outcome.lines[1].startswith("FAILED ") and outcome.lines[1].endswith("test_some.py::test_breaks")
    assert len(outcome.lines) == 2


@needs_data
@pytest.mark.slow
def test_the_quick_check_runs_every_part_on_the_cpu_and_each_passes(tmp_path):
    out = tmp_path / "gpu-check.md"
    assert gpu_check.main(["--device", "cpu", "--quick", "--data", str(REAL_DATA), "--out", str(out)]) == 0
    text = out.read_text()
    for part in ("bench", "runner", "torchrun", "tests"):
        assert f"## {part}: passed" in text
    assert "| tiny | hf-marian | eager | default |" in text and "status finished, 8 steps" in text


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.mark.parametrize(
    "main, argv, message",
    [
        (gpu.main, ["--device", "tpu"], "error: --device 'tpu': give auto, cpu, cuda or cuda:N"),
        pytest.param(
            gpu.main,
            ["--device", "cuda"],
            "error: --device cuda: no CUDA device is available; use --device cpu",
            marks=NO_CUDA,
        ),
        (gpu.main, ["--device", "cpu", "--sizes", "huge"], "error: --sizes 'huge': choose from base, big, tiny"),
        (gpu.main, ["--device", "cpu", "--backend", "fast"], "error: --backend 'fast': choose from default, cudnn,"),
        (gpu_check.main, ["--device", "tpu"], "error: --device 'tpu': give auto, cpu, cuda or cuda:N"),
        pytest.param(
            gpu_check.main,
            ["--device", "cuda"],
            "error: --device cuda: no CUDA device is available here; run it on a GPU, or --device cpu --quick",
            marks=NO_CUDA,
        ),
        (gpu_check.main, ["--device", "cpu"], "error: --device cpu: the full check needs a GPU; add --quick"),
        (
            gpu_check.main,
            ["--device", "cpu", "--quick", "--parts", "runner,bnech"],
            "error: --parts 'runner,bnech': give a comma list of bench, runner, torchrun, tests",
        ),
    ],
)
def test_a_bad_flag_is_one_line_naming_the_problem_and_the_fix(main, argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "report.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written
