"""The runs' metrics as TensorBoard curves: metrics.jsonl's records as (tag, step, value) scalars, converted once each
however often the converter runs, while a run is still writing, after it resumed, and when it has ended. Only the last
test needs tensorboard (the curves extra); the rest run on a writer that keeps the scalars in a list."""

import json
import signal
import threading
from pathlib import Path

import pytest

from ablations.runs import curves
from ablations.runs import folder as R
from ablations.runs.curves import Converter, Scalar, State


class ListWriter:
    def __init__(self) -> None:
        self.written: list[Scalar] = []
        self.closed = False

    def write(self, found: list[Scalar]) -> None:
        self.written += found

    def close(self) -> None:
        self.closed = True


class Writers(dict):
    """The writers a Converter opened, by their TensorBoard run's folder."""

    def __call__(self, log_dir: Path) -> ListWriter:
        self[log_dir] = ListWriter()
        return self[log_dir]


def make_run(root: Path, name: str, records: list[dict]) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    R.write_json(directory / R.CONFIG, {"row": name.split("-")[0], "seed": 1})
    for record in records:
        R.append_metrics(directory, record)
    return directory


def convert(runs: Path, out: Path) -> dict[str, list[Scalar]]:
    """One run of the converter, as a new process would: what it wrote, by TensorBoard run."""
    writers = Writers()
    Converter(runs, out, writers).update()
    return {log_dir.relative_to(out).as_posix(): w.written for log_dir, w in writers.items()}


def record(step: int, **more) -> dict:
    return {
        "step": step,
        "loss": 6.0 - step / 100,
        "lr": step * 1e-5,
        "tokens_per_s": 1000.0,
        "time_s": step / 10,
        **more,
    }


def test_each_number_of_a_record_is_a_scalar_at_its_step_and_nulls_and_flags_are_left_out():
    found = curves.scalars({**record(50, dev_ppl=240.0, stopped=True), "tokens_per_s": None, "grad_norm": 1.5})
    assert found == [
        Scalar("train/loss", 50, 5.5),
        Scalar("train/lr", 50, 50e-5),
        Scalar("time/train_s", 50, 5.0),
        Scalar("dev/ppl", 50, 240.0),
        Scalar("other/grad_norm", 50, 1.5),
    ]


def test_a_last_line_still_being_written_waits_for_the_next_pass(tmp_path):
    path = tmp_path / R.METRICS
    path.write_text(json.dumps(record(1)) + "\n" + json.dumps(record(2))[:20])
    records, state = curves.read_new(path, State())
    assert [r["step"] for r in records] == [1] and state.step == 1
    with open(path, "a") as f:
        f.write(json.dumps(record(2))[20:] + "\n")
    records, state = curves.read_new(path, state)
    assert [r["step"] for r in records] == [2] and (state.step, state.lines) == (2, 2)
    assert curves.read_new(path, state) == ([], state)


def test_a_damaged_line_is_one_warning_and_the_others_are_read(tmp_path, capsys):
    path = tmp_path / R.METRICS
    path.write_text(json.dumps(record(1)) + "\n" + '{"step": 2, "lo\x00\n' + "[3]\n" + json.dumps(record(4)) + "\n")
    records, state = curves.read_new(path, State())
    assert [r["step"] for r in records] == [1, 4] and state.lines == 4
    warnings = capsys.readouterr().err.strip().split("\n")
    assert len(warnings) == 2 and all(w.startswith("warning: ") for w in warnings)
    assert "line 2" in warnings[0] and "line 3" in warnings[1] and str(path) in warnings[0]


def test_running_again_writes_only_the_records_logged_since(tmp_path):
    runs, out = tmp_path / "smoke", tmp_path / "tb"
    run = make_run(runs, "base-s1-abc", [record(1), record(2)])
    first = convert(runs, out)
    assert {s.step for s in first["base-s1-abc"]} == {1, 2} and len(first["base-s1-abc"]) == 8
    assert convert(runs, out) == {}
    R.append_metrics(run, record(3, dev_ppl=300.0))
    assert {(s.tag, s.step) for s in convert(runs, out)["base-s1-abc"]} == {
        ("train/loss", 3),
        ("train/lr", 3),
        ("train/tokens_per_s", 3),
        ("time/train_s", 3),
        ("dev/ppl", 3),
    }


def test_a_resumed_run_that_rewrote_its_metrics_has_each_step_written_once(tmp_path):
    runs, out = tmp_path / "smoke", tmp_path / "tb"
    run = make_run(runs, "base-s1-abc", [record(2), record(4), record(5, stopped=True)])
    assert {s.step for s in convert(runs, out)["base-s1-abc"]} == {2, 4, 5}
    R.truncate_metrics(run, 2)  # resumed from the checkpoint at step 2: steps 4 and the stop are logged again
    R.append_metrics(run, record(4))
    assert convert(runs, out) == {}
    R.append_metrics(run, record(6))
    assert {s.step for s in convert(runs, out)["base-s1-abc"]} == {6}


def test_an_ended_run_adds_its_scores_at_its_last_step_and_an_mfu_curve_once(tmp_path):
    runs, out = tmp_path / "smoke", tmp_path / "tb"
    run = make_run(runs, "base-s1-abc", [{**record(1), "tokens_per_s": 500.0}, record(2)])
    convert(runs, out)
    final = {"status": "finished", "steps": 2, "dev_ppl": 300.0, "bleu": 0.5, "mfu": 0.4, "tokens_per_s": 800.0}
    R.write_final(run, {**final, "wall_mfu": None})
    assert set(convert(runs, out)["base-s1-abc"]) == {
        Scalar("final/dev_ppl", 2, 300.0),
        Scalar("final/bleu", 2, 0.5),
        Scalar("final/tokens_per_s", 2, 800.0),
        Scalar("final/mfu", 2, 0.4),
        Scalar("train/mfu", 1, 0.25),
        Scalar("train/mfu", 2, 0.5),
    }
    assert convert(runs, out) == {}


def test_each_run_folder_is_one_tensorboard_run_named_by_its_folder(tmp_path):
    root = tmp_path / "runs"
    make_run(root / "smoke", "base-s1-abc", [record(1)])
    make_run(root / "smoke", "A1-s1-def", [record(1)])
    assert sorted(convert(root / "smoke", tmp_path / "grid")) == ["A1-s1-def", "base-s1-abc"]
    assert sorted(convert(root, tmp_path / "root")) == ["smoke/A1-s1-def", "smoke/base-s1-abc"]
    assert list(convert(root / "smoke" / "A1-s1-def", tmp_path / "one")) == ["A1-s1-def"]
    assert curves.default_out(root / "smoke") == curves.default_out(root / "smoke" / "A1-s1-def")
    assert curves.default_out(root / "smoke") == root / "smoke" / "tensorboard"


@pytest.mark.serial
def test_following_stops_cleanly_on_sigterm_with_its_writers_closed(tmp_path, capsys):
    runs, writers = tmp_path / "smoke", Writers()
    make_run(runs, "base-s1-abc", [record(1)])
    timer = threading.Timer(0.3, signal.raise_signal, [signal.SIGTERM])
    timer.start()
    try:
        status = curves.follow(Converter(runs, tmp_path / "tb", writers), every=0.05)
    finally:
        timer.cancel()
    assert status == 143 and [w.closed for w in writers.values()] == [True]
    assert capsys.readouterr().err.strip() == "stopped by SIGTERM: 4 scalars written; run again to go on"


@pytest.mark.parametrize(
    "args, says",
    [
        (["nowhere"], "runs folder nowhere not found"),
        (["{runs}", "--every", "0"], "--every 0.0: give a number of seconds above 0"),
        (["{empty}"], "no run folders"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, says):
    make_run(tmp_path / "runs", "base-s1-abc", [record(1)])
    (tmp_path / "empty").mkdir()
    argv = [a.format(runs=tmp_path / "runs", empty=tmp_path / "empty") for a in args]
    assert curves.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err


def test_without_tensorboard_the_command_says_how_to_install_it_in_one_line(tmp_path, capsys, monkeypatch):
    make_run(tmp_path / "runs", "base-s1-abc", [record(1)])
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)  # import fails as if missing
    assert curves.main([str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e '.[curves]'" in err and "nox -s curves" in err
    assert not (tmp_path / "runs" / "tensorboard").exists()


def test_the_event_files_hold_each_scalar_once_over_two_conversions(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = tmp_path / "smoke"
    run = make_run(runs, "base-s1-abc", [record(1), record(2, dev_ppl=400.0)])
    assert curves.main([str(runs)]) == 0
    R.append_metrics(run, record(3))
    assert curves.main([str(runs)]) == 0
    assert capsys.readouterr().err.split("\n")[1].startswith("4 scalars written")  # the second run: step 3 alone
    events = EventAccumulator(str(runs / "tensorboard" / "base-s1-abc"))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3] and [e.value for e in loss] == pytest.approx([5.99, 5.98, 5.97])
    assert [(e.step, e.value) for e in events.Scalars("dev/ppl")] == [(2, 400.0)]
