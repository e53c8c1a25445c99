"""Damaged or foreign state in a runs folder is never fatal and never silent.

A final.json that cannot be read as a result leaves its run unfinished: `run` sets it aside and does the run
again, saying so; `results` and the reports skip it with a warning naming it. A checkpoint of another run is
set aside and the run starts fresh. A corpus that is not UTF-8 is an error naming the file and the line.
"""

import shutil

import pytest
import torch

from ablations.__main__ import main
from ablations.data.corpora import DataError, read_lines
from ablations.runs import folder as R
from ablations.training.checkpoints import (
    ForeignCheckpoint,
    TrainState,
    check_belongs,
    read_checkpoint,
    save_checkpoint,
)
from ablations.training.train import make_optimizer
from model import Transformer, TransformerConfig
from reports.inputs import budget_folders, load_budget
from tests.helpers import ablations_argv, logged, needs_data, result, runs_folder, smoke_cache

DAMAGE = {
    "truncated": b'{\n  "row": "D1",\n  "seed": 1,\n  "status": "fini',
    "empty": b"",
    "a list": b"[]\n",
    "no status": b'{"row": "D1", "seed": 1, "dev_ppl": 12.0}\n',
    "unknown status": b'{"row": "D1", "seed": 1, "status": "done"}\n',
    "not UTF-8": b'{"row": "D1", "seed": 1, "status": "finished", "note": "\xff"}\n',
}


def argv(runs, rows="D1,D2"):
    return ablations_argv(runs, rows, steps=2, dev_pairs=4)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A runs folder where D1 and D2 finished, and their results."""
    runs = runs_folder(tmp_path_factory.mktemp("finished"), smoke_cache(tmp_path_factory))
    assert main(argv(runs)) == 0
    dirs = {d.name.split("-")[0]: d for d in (runs / "smoke").iterdir()}
    return runs, dirs, {row: (result(d), logged(d)) for row, d in dirs.items()}


def copy_of(finished, tmp_path):
    runs, dirs, expected = finished
    shutil.copytree(runs, tmp_path / "runs")
    return tmp_path / "runs", {row: tmp_path / "runs" / "smoke" / d.name for row, d in dirs.items()}, expected


@needs_data
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.slow
def test_a_damaged_final_json_is_skipped_with_a_warning_and_its_run_done_again(damage, finished, tmp_path, capsys):
    runs, dirs, expected = copy_of(finished, tmp_path)
    final = dirs["D1"] / R.FINAL
    final.write_bytes(DAMAGE[damage])
    capsys.readouterr()

    assert R.status(dirs["D1"]) == "partial"  # not ended: its checkpoint is there
    table = R.results_table(runs)
    assert list(table["row"]) == ["D2"]
    assert f"warning: skipping {final}: " in capsys.readouterr().err
    reports = load_budget(budget_folders(runs)[0])  # the reports read the same way
    assert list(reports.runs["row"]) == ["D2"] and f"warning: skipping {final}: " in capsys.readouterr().err
    assert main(["results", "--runs", str(runs), "--out", str(tmp_path / "r.csv")]) == 0
    assert f"warning: skipping {final}: " in capsys.readouterr().err

    assert main(argv(runs)) == 0
    err = capsys.readouterr().err
    assert f"D1 s1: {final} is " in err and "set aside as final.json.damaged; the run is done again" in err
    assert (dirs["D1"] / "final.json.damaged").read_bytes() == DAMAGE[damage]  # kept for inspection
    assert {row: (result(d), logged(d)) for row, d in dirs.items()} == expected


@needs_data
def test_results_with_only_damaged_final_json_says_so_in_one_line(finished, tmp_path, capsys):
    runs, dirs, _ = copy_of(finished, tmp_path)
    for d in dirs.values():
        (d / R.FINAL).write_text("[]")
    assert main(["results", "--runs", str(runs), "--out", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"error: no readable final.json under {runs} (damaged ones skipped, see above)")
    assert sum(line.startswith("warning: skipping") for line in err) == 2


@needs_data
def test_damaged_attempts_config_and_metrics_files_do_not_stop_a_run(finished, tmp_path, capsys):
    runs, dirs, expected = copy_of(finished, tmp_path)
    (dirs["D1"] / R.FINAL).unlink()
    (dirs["D1"] / R.ATTEMPTS).write_text('["not", "a", "record"]')
    (dirs["D1"] / R.CONFIG).write_bytes(b"\xff\xfe garbage")
    with open(dirs["D1"] / R.METRICS, "ab") as f:
        f.write(b'[1, 2]\n{"step": "x"}\n\xff\xfe\n')
    assert main(argv(runs)) == 0
    assert {row: (result(d), logged(d)) for row, d in dirs.items()} == expected


@needs_data
@pytest.mark.slow
def test_a_checkpoint_of_another_run_is_set_aside_and_the_run_starts_fresh(finished, tmp_path, capsys):
    runs, dirs, expected = copy_of(finished, tmp_path)
    # D2's checkpoint passes its checksum and fits D1's shapes (rows D change only dropout and smoothing).
    for name in (R.FINAL, R.CHECKPOINT, R.previous_checkpoint(dirs["D1"] / R.CHECKPOINT).name):
        (dirs["D1"] / name).unlink(missing_ok=True)
    shutil.copyfile(dirs["D2"] / R.CHECKPOINT, dirs["D1"] / R.CHECKPOINT)
    capsys.readouterr()
    assert main(argv(runs)) == 0
    err = capsys.readouterr().err
    assert f"D1 s1: {dirs['D1'] / R.CHECKPOINT} is not this run's checkpoint (it belongs to run " in err
    assert "set aside as checkpoint.pt.foreign" in err
    assert (dirs["D1"] / "checkpoint.pt.foreign").read_bytes() == (dirs["D2"] / R.CHECKPOINT).read_bytes()
    assert {row: (result(d), logged(d)) for row, d in dirs.items()} == expected  # trained from scratch: the same run


TINY = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=30, max_len=32, P_drop=0.0)


def test_a_checkpoint_of_other_shapes_is_foreign_even_without_a_run_id(tmp_path):
    other = Transformer(TINY.replace(d_ff=64))
    save_checkpoint(tmp_path / R.CHECKPOINT, other, make_optimizer(other, torch.device("cpu")), TrainState(step=3))
    payload = read_checkpoint(tmp_path / R.CHECKPOINT)
    with pytest.raises(ForeignCheckpoint, match=r"its weights do not fit this model"):
        check_belongs(payload, Transformer(TINY), run_id=None)
    check_belongs(payload, Transformer(TINY.replace(d_ff=64)), run_id="0123abcd")  # no id recorded: shapes decide


def test_a_corpus_line_that_is_not_utf8_is_an_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes("Ein Hund.\nZwei Hunde.\nGr".encode() + b"\xfc\xdfe\n")  # Latin-1 "Grüße"
    with pytest.raises(DataError, match=rf"^{path}, line 3, byte 3: b'\\xfc' is not UTF-8; convert the file to UTF-8"):
        read_lines(path)
