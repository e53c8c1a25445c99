"""The GPU check on the CPU: its parts under their limits, what it leaves behind (nothing running), what it reads
(only this run's files) and what it writes (a report after every part, into the folder it is told)."""

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import pytest

from ablations.bench.check import __main__ as gpu_check
from ablations.bench.check import prepare
from ablations.bench.check.__main__ import LIMITS, CheckOptions, check, plan
from ablations.bench.check.parts import GRACE_S, Outcome, Part, Stage
from ablations.bench.check import report as check_report
from ablations.bench.check.report import recompile_lines, runner_lines
from ablations.bench.report import shown_args
from ablations.runs import folder as R
from plumbing.stopping import graceful_stops
from tests.helpers import REAL_DATA, REPO, needs_data

PY = sys.executable
META = {"device": "cpu", "peak": "none", "torch": "2", "python": "3", "transformers": "-", "commit": "c", "date": "d"}


def options(tmp_path, pytest_args=(), quick=True) -> CheckOptions:
    data = prepare.CheckData(tmp_path, None, {})
    return CheckOptions("cpu", quick, data, tmp_path / "work", True, tmp_path / "out", tuple(pytest_args), "--quick")


def meta(o: CheckOptions) -> dict:
    return {**META, "data": o.data.about, "args": o.args, "out": str(o.out)}


def part(name: str, code: str, limit: int, **kw) -> Part:
    return Part(name, kw.pop("what", name), (Stage(name, (PY, "-c", code)),), limit, **kw)


@pytest.mark.slow
def test_every_part_is_reported_and_a_failing_or_hanging_part_stops_no_other(tmp_path):
    parts = [
        part("bench", "import sys; print('boom'); sys.exit(3)", 30, what="fails"),
        part("runner", "import time; time.sleep(600)", GRACE_S + 3, what="hangs"),
        part("torchrun", "pass", 30, skip="skipped: no torchrun", what="not here"),
        part("tests", "print('3 passed in 0.01s')", 30, what="passes"),
    ]
    o = options(tmp_path)
    started = time.perf_counter()
    outcomes = check(o, parts, meta(o))
    assert time.perf_counter() - started < 300  # the hanging part was stopped at its limit, far before its 600 s
    assert [x.result for x in outcomes] == [
        "failed (exit 3)",
        f"timed out at its limit of {GRACE_S + 3} s",
        "skipped: no torchrun",
        "passed",
    ]
    assert "boom" in outcomes[0].tail
    text = (o.out / "gpu-check.md").read_text()
    assert "| bench | fails | 30 s |" in text and "| tests | passes | 30 s |" in text and "| passed |" in text
    assert "- no report of this run at bench-gpu.json (missing, damaged, or older than the part)" in text
    assert "- no run folder was written" in text and "- tests: 3 passed in 0.01s" in text
    assert "| the runner's targets | - | - | not measured: no run folder |" in text
    record = json.loads((o.out / "gpu-check.json").read_text())
    assert [p["name"] for p in record["parts"]] == ["bench", "runner", "torchrun", "tests"]
    assert all(p["started"] >= "2026" for p in record["parts"]) and record["torch"] == "2"
    assert (o.out / "logs" / "bench.log").read_text().endswith("sys.exit(3)'\nboom\n")


@pytest.mark.slow
def test_a_stage_that_would_start_without_its_minimum_time_is_not_started_and_said_so(tmp_path):
    stages = (Stage("first", (PY, "-c", "import time; time.sleep(2)")), Stage("second", (PY, "-c", "pass"), min_s=60))
    o = options(tmp_path)
    (outcome,) = check(o, [Part("tests", "two stages", stages, 20)], meta(o))
    assert outcome.stages[0] == "first: passed" and outcome.stages[1].startswith("second: not started, ")
    assert outcome.result == "passed (not every stage started)"


@pytest.mark.slow
@pytest.mark.serial
def test_a_process_a_part_left_running_in_a_session_of_its_own_is_stopped_with_the_part(tmp_path):
    pidfile = tmp_path / "stray.pid"
    stray = f"import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid))"
    script = (
        "import sys\nfrom pathlib import Path\n"
        "from ablations.bench.check.parts import Part, Stage, become_subreaper, run_part\n"
        "become_subreaper()\n"
        f"part = Part('p', 'p', (Stage('p', (sys.executable, '-c', {stray!r})),), 20)\n"
        f"print(run_part(part, Path({str(tmp_path / 'log')!r}), Path({str(REPO)!r})).result)\n"
        f"print(open({str(pidfile)!r}).read())\n"
    )
    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    result, pid = done.stdout.split()
    assert result == "passed", done.stderr
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]


@pytest.mark.slow
@pytest.mark.serial
def test_the_tests_part_stopped_at_its_limit_still_names_the_tests_that_failed_before(tmp_path):
    (tmp_path / "test_some.py").write_text(
        "import time\n\ndef test_breaks():\n    assert False\n\ndef test_hangs():\n    time.sleep(60)\n"
    )
    o = options(tmp_path, ("-q", "-p", "no:cacheprovider", str(tmp_path / "test_some.py")))
    tests = next(p for p in plan(o) if p.name == "tests")
    with graceful_stops():  # as main runs it: its parts take SIGINT even where this process ignores it (xdist)
        (outcome,) = check(o, [dataclasses.replace(tests, limit_s=GRACE_S + 4)], meta(o))
    assert outcome.result == f"timed out at its limit of {GRACE_S + 4} s"
    lines = json.loads((o.out / "gpu-check.json").read_text())["parts"][0]["lines"]
    assert "1 failed" in lines[0]
    assert lines[1].startswith("FAILED ") and lines[1].endswith("test_some.py::test_breaks") and len(lines) == 2


def test_the_tests_part_runs_the_cuda_only_tests_first_then_the_device_sensitive_ones_then_the_rest(tmp_path):
    o = dataclasses.replace(options(tmp_path, quick=False), data=prepare.CheckData(REAL_DATA, None, {}))
    tests = next(p for p in plan(o) if p.name == "tests")
    assert [s.name for s in tests.stages] == ["cuda-only", "device-sensitive", "the rest"]
    first, device, rest = (s.command for s in tests.stages)
    assert first[-2 - len(gpu_check.CUDA_TESTS) :] == ("-m", "cuda", *gpu_check.CUDA_TESTS)
    assert all(path in device for path in gpu_check.DEVICE_TESTS) and all((REPO / p).is_file() for p in device[-4:])
    assert all(f"--ignore={path}" in rest for path in gpu_check.DEVICE_TESTS) and "not cuda" in rest
    assert tests.env["AIAYN_DATA"] == str(REAL_DATA)  # the tests that read the corpora run, not skip


def test_every_part_shows_the_checks_work_and_out_folders_by_name_in_the_commands_its_reports_print(
    tmp_path, monkeypatch
):
    o = options(tmp_path)
    for part in plan(o):
        for name, value in part.env.items():
            monkeypatch.setenv(name, value)  # as the part's process sees its environment
        shown = shown_args(["--runs", str(o.work / "runs"), "--out", str(o.out / "bench-gpu.md")])
        assert shown == "--runs WORK/runs --out OUT/bench-gpu.md", part.name


def test_the_parts_limits_leave_the_checks_start_and_report_inside_eight_minutes():
    assert sum(LIMITS.values()) <= 8 * 60 - 20


def test_the_runner_part_saves_only_its_last_step_and_the_torchrun_part_forces_ddp(tmp_path):
    runner, torchrun = (p for p in plan(options(tmp_path, quick=False)) if p.name in ("runner", "torchrun"))
    assert runner.stages[0].command[-8:-6] == ("--checkpoint-every", "1000")  # > 300 steps: the last one's only
    assert "--ddp" in torchrun.stages[0].command and "--steps" not in torchrun.stages[0].command


def test_parts_picks_which_parts_run_in_the_checks_own_order(tmp_path):
    argv = ["--device", "cpu", "--quick", "--parts", "tests,runner", "--data", str(tmp_path), "--out", str(tmp_path)]
    assert [p.name for p in plan(gpu_check.parse([*argv, "--work", str(tmp_path)]))] == ["runner", "tests"]


def test_an_earlier_checks_files_are_set_aside_never_read_as_this_runs(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu-check.json").write_text(json.dumps({"date": "2026-11-01T10:00:00+00:00"}))
    (out / "bench-gpu.json").write_text(json.dumps({"training": [], "decoding": [], "notes": ["old"]}))
    gpu_check.set_earlier_aside(out)
    assert sorted(p.name for p in out.iterdir()) == ["earlier-2026-11-01T100000"]
    assert (out / "earlier-2026-11-01T100000" / "bench-gpu.json").is_file()


def test_a_report_older_than_its_part_is_not_read_as_this_runs(tmp_path):
    o = options(tmp_path)
    o.out.mkdir(parents=True)
    (o.out / "bench-gpu.json").write_text(json.dumps({"training": [], "decoding": [], "notes": ["stale"]}))
    time.sleep(1.1)
    (outcome,) = check(o, [part("bench", "pass", 30)], meta(o))
    assert "stale" not in (o.out / "gpu-check.md").read_text()
    assert "no report of this run at bench-gpu.json" in (o.out / "gpu-check.md").read_text()


def test_the_runner_lines_give_steady_state_figures_and_the_longest_step_compiling_included(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for step, time_s in [(25, 30.0), (50, 32.5), (75, 35.5)]:  # 30 s of compiling in the first window
        R.append_metrics(run, {"step": step, "loss": 5.0, "tokens_per_s": 1.0, "time_s": time_s})
    R.write_final(run, {"status": "finished", "steps": 75, "tokens_per_s": 12000.0, "mfu": 0.31})
    finals, windows, steps = runner_lines(run)
    assert "status finished, 75 steps" in finals and "12,000 tokens/s, MFU 31.0%" in finals
    assert "graphs compiled not recorded, compiling not recorded" in finals
    assert "p50 110.0 ms, p99 120.0 ms, max 120.0 ms over 2 windows" in windows
    assert "the first (to step 25, where compiling falls) 1200.0 ms" in windows
    assert steps == "per-step times: not recorded in metrics.jsonl"


@needs_data
@pytest.mark.slow
def test_prepare_makes_a_small_folder_the_parts_read_without_training_a_tokenizer(tmp_path, capsys):
    target = tmp_path / "gpu-data"
    assert gpu_check.main(["--prepare", str(target), "--data", str(REAL_DATA)]) == 0
    data = prepare.check_data(target)
    assert data.corpora == target / "data" and set(data.manifest["budgets"]) == {"short", "smoke"}
    assert data.manifest["mib"] < 40  # it travels with the repository (15 MiB) under the device tool's 64 MiB
    assert sorted(p.suffix for p in data.cache.iterdir()).count(".model") == 2
    assert sorted(p.name for p in data.encoded.iterdir()) == ["short", "smoke"]
    runs = tmp_path / "runs"
    prepare.seed_runs(data, runs)
    assert sorted(p.name for p in (runs / "cache").iterdir()) == sorted(p.name for p in data.cache.iterdir())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert gpu_check.main(["--prepare", str(tmp_path / "mine"), "--data", str(REAL_DATA)]) == 2
    assert "is not a prepared folder; name a new one" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


@needs_data
@pytest.mark.slow
def test_the_quick_check_runs_every_part_on_the_cpu_and_each_passes(tmp_path):
    out = tmp_path / "out"
    assert gpu_check.main(["--device", "cpu", "--quick", "--data", str(REAL_DATA), "--out", str(out)]) == 0
    text = (out / "gpu-check.md").read_text()
    for name in ("bench", "runner", "torchrun", "tests"):
        assert f"## {name}: passed" in text
        assert (out / "logs" / f"{name}.log").is_file()
    assert "| tiny | hf-marian | eager | default |" in text and "status finished, 8 steps" in text
    assert "- One tiny, reference, eager, default step" in text  # its profile, or why none (a loaded machine)
    assert "- recompiles (TORCH_LOGS=recompiles)" in text and "gemm_fraction (model FLOP/s over" in text
    assert (out / "bench-gpu.json").is_file()
    torchrun = next(p for p in json.loads((out / "gpu-check.json").read_text())["parts"] if p["name"] == "torchrun")
    assert torchrun["records"][R.FINAL]["status"] == "finished" and torchrun["records"][R.METRICS]
    assert len([p for p in out.rglob("*") if p.is_file()]) <= 8  # what a GPU machine of the device tool returns


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "error: --device 'tpu': give auto, cpu, cuda or cuda:N"),
        (["--device", "cpu", "--parts", "runner,bnech"], "error: --parts 'runner,bnech': give a comma list of bench,"),
        (["--device", "cpu", "--out", "report.md"], "error: --out report.md: give a folder (the check writes several"),
    ],
)
def test_a_bad_flag_is_one_line_naming_the_problem_and_the_fix(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert gpu_check.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.mark.parametrize("session", ["gpu_check", "bench_gpu"])
def test_the_gpu_nox_sessions_run_the_machines_own_torch_and_install_nothing_over_it(session):
    tree = ast.parse((REPO / "noxfile.py").read_text())
    function = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == session)
    (decorator,) = function.decorator_list
    assert {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}["venv_backend"] == "none"
    assert "install" not in ast.unparse(function)  # a venv's pins would put the CPU build of torch over CUDA's


def test_the_cuda_only_stage_names_every_file_that_holds_a_cuda_test():
    marked = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if re.search(r"^\s*@(needs_cuda|pytest\.mark\.cuda)\b|^pytestmark.*mark\.cuda", path.read_text(), re.M)
    }
    assert marked == set(gpu_check.CUDA_TESTS)


def stages_cut_at(limit: int, best_effort: bool) -> Part:
    """A part whose first stage passes and whose second runs past the limit."""
    return Part(
        "tests",
        "two stages",
        (
            Stage("cuda-only", (PY, "-c", "pass")),
            Stage("the rest", (PY, "-c", "import time; time.sleep(120)"), best_effort=best_effort),
        ),
        limit,
    )


@pytest.mark.slow
def test_a_best_effort_stage_cut_at_the_limit_after_the_others_passed_leaves_the_part_passed_with_a_note(tmp_path):
    o = options(tmp_path)
    limit = GRACE_S + 4
    (passed,) = check(o, [stages_cut_at(limit, best_effort=True)], meta(o))
    assert passed.result == f"passed (the rest, best effort, cut at the limit of {limit} s)"
    assert passed.stages == ("cuda-only: passed", "the rest: stopped at the part's limit (best effort)")
    (required,) = check(o, [stages_cut_at(limit, best_effort=False)], meta(o))
    assert required.result == f"timed out at its limit of {limit} s"


def test_the_tests_parts_later_stages_are_best_effort_and_its_first_is_not(tmp_path):
    o = dataclasses.replace(options(tmp_path, quick=False), data=prepare.CheckData(REAL_DATA, None, {}))
    tests = next(p for p in plan(o) if p.name == "tests")
    assert [s.best_effort for s in tests.stages] == [False, True, True]


def test_a_best_effort_stage_that_had_a_test_fail_before_its_cut_fails_the_part(tmp_path):
    cut = Outcome("passed (the rest, best effort, cut at the limit of 80 s)", 80.0, "2026", ())
    lines = ["cuda-only: 4 passed in 40s", "the rest: 1 failed, 30 passed", "FAILED tests/test_x.py::test_y"]
    failed = "failed (a test failed before the limit cut a best-effort stage)"
    assert gpu_check.judged(cut, lines).result == failed
    assert gpu_check.judged(cut, lines[:1]).result == cut.result
    assert gpu_check.judged(Outcome("passed", 1.0, "2026", ()), lines).result == "passed"  # a stage that ended
    log = tmp_path / "tests.log"  # cut before pytest's summary: its progress marks say what failed
    log.write_text(
        "==== cuda-only: pytest\n....  [100%]\n4 passed in 9s\n==== the rest: pytest\nbringing up nodes...\n"
        "sentencepiece trained\n....F...........   [ 9%]\n..F.9"  # no mark in a word; the last line cut mid-write
    )
    marks = check_report.tests_lines(log)  # imported by name, pytest would collect it as a test
    assert marks == [
        "cuda-only: 4 passed in 9s",
        "the rest: cut short, 2 failed or erred by pytest's progress marks (20 run)",
    ]
    assert gpu_check.judged(cut, marks).result == failed
    log.write_text("==== cuda-only: pytest\n....  [100%]\n4 passed in 9s\n==== the rest: pytest\n...\n")
    (_, clean) = check_report.tests_lines(log)
    assert clean == "the rest: cut short after 3 tests, none failed by pytest's progress marks"
    assert gpu_check.judged(cut, [clean]).result == cut.result


def test_the_runner_part_logs_torchs_recompiles_and_the_report_keeps_them(tmp_path):
    runner = next(p for p in plan(options(tmp_path, quick=False)) if p.name == "runner")
    assert runner.env["TORCH_LOGS"] == "recompiles"
    log = tmp_path / "runner.log"
    prefix = "V1127 11:47:20.445000 573 torch/_dynamo/guards.py:4760] [0/1] [__recompiles]"
    log.write_text(
        "base s1:   2%|▏         | 2/120 [01:23<1:07:55, 34.54s/step]\x1b[A"  # a progress bar, then torch's lines
        f"{prefix} Recompiling function forward in model/transformer.py:127\n"
        f"{prefix}     triggered by the following guard failure(s):\n"
        f"{prefix}     - 0/0: 512*src.size()[0]*tgt.size()[1] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)\n"
    )
    lines = recompile_lines(log)
    assert lines[0] == "recompiles (TORCH_LOGS=recompiles), 3 lines:"
    assert lines[1] == "`[0/1] [__recompiles] Recompiling function forward in model/transformer.py:127`"
    assert lines[3].startswith("`[0/1] [__recompiles]     - 0/0: 512*src.size()[0]*tgt.size()[1] >= 5242880")
    log.write_text("step 25\n")
    assert recompile_lines(log) == ["recompiles (TORCH_LOGS=recompiles): none logged"]


def test_the_gemm_fraction_a_run_recorded_is_reported_and_none_is_not(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    R.write_final(run, {"status": "finished", "device": "cpu (2 threads)", "gemm_fraction": 0.31, "mfu": None})
    assert "gemm_fraction (model FLOP/s over this CPU's measured fp32 GEMM rate): 31%" in runner_lines(run)
    R.write_final(run, {"status": "finished", "device": "NVIDIA H200", "gemm_fraction": None, "mfu": 0.09})
    lines = runner_lines(run)
    assert "MFU 9.0%" in lines[0] and not any("gemm_fraction" in line for line in lines)
