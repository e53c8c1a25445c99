"""Prepared data (ablations/grid/prepared.py): a budget's encoded data saved once and loaded whole without a corpus
or a BPE to train, as the GPU benchmark's --prepared reads it."""

import json

import numpy as np
import pytest

from ablations.bench.gpu import __main__ as gpu
from ablations.grid import prepared
from ablations.data.corpora import DataError
from ablations.grid.prepared import load_prepared, save_prepared
from ablations.grid.runner import prepare_data
from ablations.runs.budgets import budget
from tests.helpers import REAL_DATA, needs_data

pytestmark = needs_data


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return prepare_data(budget("smoke"), "multi30k", REAL_DATA, tmp_path_factory.mktemp("runs"))


def test_saved_data_loads_back_equal_with_its_bpe(smoke, tmp_path):
    save_prepared(smoke, tmp_path, "smoke")
    loaded = load_prepared(tmp_path, "smoke")
    for field in ("preset", "bpe_key", "train_src", "train_tgt", "dev_src", "dev_tgt", "dev_refs", "summary"):
        assert getattr(loaded, field) == getattr(smoke, field), field
    sentence = "Zwei Hunde spielen im Schnee."
    assert loaded.sp.encode(sentence) == smoke.sp.encode(sentence)
    assert loaded.sp.get_piece_size() == smoke.sp.get_piece_size()


def test_the_saved_ids_are_compact_arrays(smoke, tmp_path):
    folder = save_prepared(smoke, tmp_path, "smoke")
    with np.load(folder / prepared.IDS) as arrays:
        assert arrays["train_src_ids"].dtype == np.uint16  # a 1000-token BPE: two bytes an id
        assert arrays["train_src_lengths"].sum() == arrays["train_src_ids"].size
    rows = [row for name in prepared.SETS for row in getattr(smoke, name)]
    ids = sum(len(row) for row in rows)
    assert (folder / prepared.IDS).stat().st_size <= 2 * ids + 4 * len(rows) + 4096  # ids, lengths, the archive's own


def test_nothing_saved_or_saved_under_other_budget_settings_loads_as_none(smoke, tmp_path):
    assert load_prepared(tmp_path, "smoke") is None
    folder = save_prepared(smoke, tmp_path, "smoke")
    about = json.loads((folder / prepared.META).read_text())
    about["settings"]["vocab_size"] += 1  # as if the budget's BPE size had changed since
    (folder / prepared.META).write_text(json.dumps(about))
    assert load_prepared(tmp_path, "smoke") is None


def test_a_damaged_prepared_folder_is_one_line_naming_it_and_the_fix(smoke, tmp_path):
    folder = save_prepared(smoke, tmp_path, "smoke")
    (folder / prepared.IDS).write_bytes(b"not an archive")
    with pytest.raises(DataError, match=r"smoke: unreadable prepared data .*; delete it and prepare again$"):
        load_prepared(tmp_path, "smoke")


def bench(tmp_path, *extra):
    argv = ["--device", "cpu", "--systems", "reference", "--steps", "1", "--warmup", "1", "--decode-sentences", "2"]
    argv += ["--decode-reps", "1", "--data", str(REAL_DATA), "--runs", str(tmp_path / "runs")]
    return gpu.main([*argv, "--out", str(tmp_path / "bench-gpu.md"), *extra])


def test_the_bench_prepares_into_an_empty_prepared_folder_and_then_loads_from_it_without_a_corpus(
    smoke, tmp_path, monkeypatch
):
    assert bench(tmp_path, "--prepared", str(tmp_path / "prepared")) == 0
    first = json.loads((tmp_path / "bench-gpu.json").read_text())
    assert first["data_from"]["smoke"].startswith("read, BPE-encoded") and "saved to" in first["data_from"]["smoke"]

    def no_corpus(*args):
        raise AssertionError("read the corpus although the data was prepared")

    monkeypatch.setattr(gpu, "prepare_data", no_corpus)
    assert bench(tmp_path, "--prepared", str(tmp_path / "prepared")) == 0
    second = json.loads((tmp_path / "bench-gpu.json").read_text())
    assert second["data_from"]["smoke"].startswith(f"loaded from {tmp_path / 'prepared' / 'smoke'}")
    assert second["prepare_s"] < first["prepare_s"] + 1 and second["status"] == "complete"
    assert second["training"][0]["status"] == "measured"


def test_a_prepared_path_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "data.npz").write_text("")
    assert bench(tmp_path, "--prepared", str(tmp_path / "data.npz")) == 2
    err = capsys.readouterr().err
    assert err == f"error: --prepared {tmp_path / 'data.npz'} is a file; give the folder the data was prepared in\n"
