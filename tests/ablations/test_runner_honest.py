"""The runner's timing says what it measured: each step timed alone (no evaluation or checkpoint inside it), a recompile
visible as a stall, throughput and MFU of the steady state with compile time and the wall-clock rate beside them, and
MFU held to the peak of the very card it ran on."""

from __future__ import annotations

import dataclasses
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from ablations.bench.check.targets import runner_targets
from ablations.data.batching import BatchStream
from ablations.grid import runner
from ablations.grid.runner import prepare_data, run_one
from ablations.__main__ import main
from ablations.runs import folder as R
from ablations.runs import options
from ablations.runs.budgets import select_rows
from ablations.training import checkpoints as C, train as T
from ablations.training.clock import StepClock
from ablations.training.peaks import Peak, peak, peak_flops, peak_of_name
from ablations.training.distributed import SINGLE
from model import Transformer, count_parameters
from plumbing import stopping
from tests.ablations.test_gpu_path import TINY, tiny_run, varied_pairs
from tests.ablations.test_train import TINY_BUDGET, grid_of
from tests.helpers import NO_DATA, REAL_DATA, needs_data

PAUSE = 100.0  # seconds the clock moves on for slowed work, without waiting: beyond any step of the tiny model, on
# however busy a machine (a sleep of a fraction of a second was not: a step that waits for a kernel build outlasts it)
_shift = [0.0]


@pytest.fixture(autouse=True)
def shifted_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.perf_counter, which the runner's clock reads, running PAUSE seconds ahead after each `pause()`."""
    real, _shift[0] = time.perf_counter, 0.0
    monkeypatch.setattr(time, "perf_counter", lambda: real() + _shift[0])


def pause() -> None:
    """Work that takes PAUSE seconds, as the clock sees it."""
    _shift[0] += PAUSE


def slowed(monkeypatch: pytest.MonkeyPatch, name: str) -> list[float]:
    """train.py's `name` (work the loop does between steps) made PAUSE seconds slower; returns the pauses made."""
    work, pauses = getattr(T, name), []

    def slow(*args, **kwargs):
        pause()
        pauses.append(PAUSE)
        return work(*args, **kwargs)

    monkeypatch.setattr(T, name, slow)
    return pauses


def compiling_at(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> None:
    """torch.compile made to compile one graph, taking PAUSE seconds, in each of `steps` (counted from 1)."""
    step, calls, graphs = T.train_step, [0], [0]

    def train_step(*args, **kwargs):
        calls[0] += 1
        if calls[0] in steps:
            pause()
            graphs[0] += 1
        return step(*args, **kwargs)

    monkeypatch.setattr(T, "train_step", train_step)
    monkeypatch.setattr(T, "compiles", lambda: graphs[0])


def train_tiny(tmp_path, steps: int, log_every: int, checkpoint_every: int) -> tuple[T.TrainState, list[dict]]:
    run, (src, tgt) = tiny_run(tmp_path, steps, log_every, checkpoint_every, compile=False), varied_pairs(200)
    run = dataclasses.replace(run, settings=dataclasses.replace(run.settings, eval_every=log_every))
    state = T.train(Transformer(TINY), run, BatchStream(src, tgt, 120, seed=1), (src[:4], tgt[:4]), torch.device("cpu"))
    return state, R.read_metrics(run.directory)


def test_a_pause_between_steps_is_counted_in_no_step():
    clock = StepClock(torch.device("cpu"))
    for graphs in (0, 1):
        clock.start()
        clock.lap(graphs, tokens=10)
        pause()  # evaluation, a checkpoint, logging: between steps
    laps = clock.read()
    assert len(laps.steps) == len(laps.compiling) == 1 and max(laps.steps + laps.compiling) < PAUSE
    assert (laps.steady_tokens, laps.compiles) == (10, 1)


@pytest.mark.slow
def test_evaluation_and_checkpoints_are_outside_every_step_time(tmp_path, monkeypatch):
    saves, evaluations = slowed(monkeypatch, "save_checkpoint"), slowed(monkeypatch, "perplexity")
    started = time.perf_counter()
    state, logged = train_tiny(tmp_path, 8, log_every=2, checkpoint_every=3)
    elapsed = time.perf_counter() - started
    assert [r["step"] for r in logged] == [2, 4, 6, 8] and all("dev_ppl" in r for r in logged)
    assert all(r["step_s_max_all"] < PAUSE for r in logged)  # each step after a save or an evaluation included
    assert (len(saves), len(evaluations)) == (3, 4) and state.wall_s < elapsed - sum(saves + evaluations)


def test_a_recompile_after_warm_up_shows_in_its_window_and_fails_the_stall_target(tmp_path, monkeypatch):
    compiling_at(monkeypatch, {1, 23})
    state, logged = train_tiny(tmp_path, 30, log_every=5, checkpoint_every=30)
    assert [r["compiles"] for r in logged] == [1, 0, 0, 0, 1, 0] and state.compiles == 2
    recompiled = logged[4]
    assert recompiled["step_s_max"] < PAUSE <= recompiled["step_s_max_all"] and recompiled["compile_s"] >= PAUSE
    final = {"steps": state.step, "wall_s": state.wall_s, "compile_s": state.compile_s}
    assert runner_targets(logged, final)[0].endswith("| <= 3.0x | not met |")


def test_the_steady_state_counts_the_steps_that_compiled_nothing_and_the_wall_clock_all(tmp_path, monkeypatch):
    compiling_at(monkeypatch, {1})
    state, logged = train_tiny(tmp_path, 6, log_every=3, checkpoint_every=6)
    src, tgt = varied_pairs(200)
    first = BatchStream(src, tgt, 120, seed=1).next()
    assert state.steady_tokens == state.tokens_seen - first.src_tokens - first.tgt_tokens
    assert state.compile_s >= PAUSE and state.steady_s > 0
    assert state.wall_s == pytest.approx(state.steady_s + state.compile_s)
    assert logged[0]["tokens_per_s"] > state.tokens_seen / state.wall_s  # the window's rate is a steady one too


def test_a_checkpoint_from_before_the_steady_fields_loads_and_counts_them_from_the_resume(tmp_path, monkeypatch):
    model = Transformer(TINY)
    optimizer = T.make_optimizer(model, torch.device("cpu"))
    older = {"step": 4, "tokens_seen": 900, "wall_s": 2.0, "compile_s": 1.5, "compiles": 1, "epoch": 0, "index": 4}
    monkeypatch.setattr(C, "asdict", lambda state: older)  # what a checkpoint of the runner before them holds
    C.save_checkpoint(tmp_path / "checkpoint.pt", model, optimizer, C.TrainState())
    state = C.load_checkpoint(tmp_path / "checkpoint.pt", model, optimizer)
    assert state == C.TrainState(**older, steady_s=0.0, steady_tokens=0)


@pytest.mark.parametrize("device, measured", [("cpu", True), ("cuda", False)])
def test_a_run_records_its_share_of_the_gemm_rate_on_a_cpu_and_only_mfu_on_a_gpu(device, measured, monkeypatch):
    # On a GPU one small fp32 matrix product times its launch, not the card: the card's peak is the yardstick there.
    monkeypatch.setattr(runner, "peak", lambda device: Peak("a test card", 1e12))
    state = T.TrainState(step=3, tokens_seen=900, wall_s=2.0, steady_s=1.0, steady_tokens=600)
    grid, run = SimpleNamespace(device=torch.device(device), ranks=SINGLE), SimpleNamespace(config=TINY)
    final = {"gemm_fraction": None}
    runner.add_rates(final, state, grid, run, count_parameters(Transformer(TINY).parameter_groups()))
    assert final["mfu"] > 0 and (final["gemm_fraction"] is not None) == measured


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    if not REAL_DATA.is_dir():
        pytest.skip(NO_DATA)
    runs = tmp_path_factory.mktemp("honest-runs")
    return runs, prepare_data(TINY_BUDGET, "multi30k", REAL_DATA, runs)


@needs_data
def test_final_json_gives_steady_tokens_per_s_and_mfu_with_the_wall_clock_rates_and_the_card_beside(
    tiny_data, monkeypatch
):
    runs, data = tiny_data
    compiling_at(monkeypatch, {1})
    monkeypatch.setattr(runner, "peak", lambda device: Peak("a test card", 1e12))
    directory, status = run_one(grid_of(runs / "honest", "reference"), select_rows("base")[0], 1, data)
    final = R.read_json(directory / R.FINAL)
    assert status == "finished" and (final["compiles"], final["steps"]) == (1, 3) and final["compile_s"] >= PAUSE
    assert final["tokens_per_s"] > final["wall_tokens_per_s"] == pytest.approx(final["tokens_seen"] / final["wall_s"])
    assert final["mfu"] / final["wall_mfu"] == pytest.approx(final["tokens_per_s"] / final["wall_tokens_per_s"])
    assert (final["peak_card"], final["peak_flops"], final["ddp"], final["dist_backend"]) == (
        "a test card",
        1e12,
        False,
        None,
    )


@needs_data
def test_checkpoints_can_be_put_off_past_the_last_step_for_a_timing_check(tmp_path):
    argv = ["--budget", "smoke", "--rows", "base", "--device", "cpu", "--runs", str(tmp_path), "--checkpoint-every"]
    assert options.parse([*argv, "1000"]).budget.checkpoint_every == 1000  # the last step alone is saved
    assert main(["run", *argv, "0"]) == 2


@pytest.mark.parametrize(
    "name, card, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756),
        ("NVIDIA H100 NVL", "H100 NVL", 835),
        ("NVIDIA H200", "H200 SXM", 989),
        ("NVIDIA H200 NVL", "H200 NVL", 835),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB", 312),
        ("NVIDIA A100 80GB PCIe", "A100 80GB", 312),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 312),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 312),
        ("NVIDIA L40S", "L40S", 362),
        ("NVIDIA L4", "L4", 121),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165),
        ("NVIDIA A10", "A10", 125),
    ],
)
def test_each_card_gets_its_own_peak_from_the_name_torch_gives_it(name, card, tflops):
    assert peak_of_name(name) == Peak(card, tflops * 1e12)


@pytest.mark.parametrize(
    "name", ["NVIDIA L40", "NVIDIA A10G", "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100"]
)
def test_a_card_not_listed_or_a_mig_slice_has_no_peak_so_no_mfu(name):
    assert peak_of_name(name) is None


def test_a_peak_names_its_card_and_the_cpu_has_none():
    assert str(peak_of_name("NVIDIA H100 80GB HBM3")) == "peak 989 TFLOP/s (H100 SXM)"
    assert peak(torch.device("cpu")) is None and peak_flops(torch.device("cpu")) is None


def test_a_run_stopped_between_logging_steps_records_the_step_times_since_the_last_log(tmp_path):
    run, (src, tgt) = tiny_run(tmp_path, 20, 5, 20, compile=False), varied_pairs(200)

    def stop_at_step_7(step: int) -> None:  # a SIGTERM (the GPU check's limit) arriving during step 8
        if step == 7:
            stopping._pending.signum = signal.SIGTERM

    with stopping.graceful_stops(), pytest.raises(stopping.Stopped):
        T.train(
            Transformer(TINY),
            run,
            BatchStream(src, tgt, 120, seed=1),
            (src[:4], tgt[:4]),
            torch.device("cpu"),
            on_step=stop_at_step_7,
        )
    logged = R.read_metrics(run.directory)
    assert [r["step"] for r in logged] == [5, 8] and logged[-1]["stopped"] and "stopped" not in logged[0]
    assert logged[-1]["step_s_p50"] > 0 and logged[-1]["time_s"] > logged[0]["time_s"]
