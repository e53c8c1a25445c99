"""The ablation runner's data: presets read in place, one-line errors, normalisation, held-out removal, batching."""

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ablations.data.batching import BatchStream, bucketed_batches, make_batch
from ablations.data.bpe import BOS, EOS, PAD, bpe_key, shared_bpe
from ablations.data.corpora import DataError, Pairs, data_dir, load_corpus, normalise, read_lines, read_pairs, shuffled
from ablations.runs.budgets import BUDGETS, row_config, row_lr_peak, select_rows
from tests.helpers import REAL_DATA, needs_data


def write_pair(root: Path, stem: str, en: list[str], de: list[str]) -> None:
    (root / stem).parent.mkdir(parents=True, exist_ok=True)
    (root / f"{stem}.en").write_text("".join(s + "\n" for s in en), encoding="utf-8")
    (root / f"{stem}.de").write_text("".join(s + "\n" for s in de), encoding="utf-8")


def fake_multi30k(root: Path) -> None:
    write_pair(root, "multi30k/val", ["a dev sentence"], ["ein Dev-Satz"])
    write_pair(root, "multi30k/test_2016_flickr", ["a test sentence"], ["ein Test-Satz"])
    write_pair(
        root,
        "multi30k/train",
        [f"train {i}" for i in range(20)] + ["a dev sentence", "x"],
        [f"Zug {i}" for i in range(20)] + ["anders", "ein Test-Satz"],
    )


def test_missing_data_folder_is_one_line_naming_the_path_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("AIAYN_DATA", raising=False)
    with pytest.raises(DataError, match=r"data folder .*nowhere not found; pass --data DIR or set AIAYN_DATA") as info:
        data_dir(tmp_path / "nowhere")
    assert "\n" not in str(info.value)


def test_data_folder_comes_from_the_environment_when_no_option_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_DATA", str(tmp_path))
    assert data_dir(None) == tmp_path


def test_missing_file_names_the_file_and_the_preset(tmp_path):
    with pytest.raises(DataError, match=r"missing data file .*wmt14/train\.en for preset 'wmt14'.*your own WMT14"):
        write_pair(tmp_path, "wmt_newstest_ende/newstest2013", ["a"], ["b"])
        write_pair(tmp_path, "wmt_newstest_ende/newstest2014", ["c"], ["d"])
        load_corpus("wmt14", tmp_path)


def test_misaligned_files_are_an_error_naming_both_line_counts(tmp_path):
    write_pair(tmp_path, "c", ["one", "two", "three"], ["eins", "zwei"])
    with pytest.raises(
        DataError, match=r"c\.en has 3 lines but .*c\.de has 2; the \.en and \.de files must be line-aligned"
    ):
        read_pairs(tmp_path, "c", "multi30k")


def test_empty_corpus_is_an_error(tmp_path):
    write_pair(tmp_path, "c", ["", "  "], ["", "x"])
    with pytest.raises(DataError, match="is empty"):
        read_pairs(tmp_path, "c", "multi30k")


def test_lines_split_on_newline_only_and_whitespace_is_normalised(tmp_path):
    path = tmp_path / "f.de"
    path.write_bytes(" Ein\u00a0Hund\tläuft.\u0085 Weiter \nZwei\n".encode())
    lines = read_lines(path)
    assert len(lines) == 2  # U+0085 (NEL) is inside line 1; splitlines() would make three lines
    assert normalise(lines[0]) == "Ein Hund läuft. Weiter"


def test_dev_and_test_sentences_are_removed_from_training(tmp_path):
    fake_multi30k(tmp_path)
    corpus = load_corpus("multi30k", tmp_path)
    held_out = {"a dev sentence", "ein Dev-Satz", "a test sentence", "ein Test-Satz"}
    assert corpus.removed_overlap == 2
    assert not held_out & (set(corpus.train.src) | set(corpus.train.tgt))
    assert len(corpus.train) == 20


def test_shuffle_is_deterministic_by_seed_and_keeps_pairs_aligned():
    pairs = Pairs(tuple(f"s{i}" for i in range(50)), tuple(f"t{i}" for i in range(50)))
    a, b, c = shuffled(pairs, 1), shuffled(pairs, 1), shuffled(pairs, 2)
    assert a == b and a != c
    assert all(s[1:] == t[1:] for s, t in zip(a.src, a.tgt))


def test_unknown_row_lists_the_valid_names():
    with pytest.raises(
        ValueError, match=r"unknown row 'F2'; valid rows: all, base, A1, A2, A3, A4, B1.*big; groups: A, B, C, D, E"
    ):
        select_rows("base,F2")


def test_groups_expand_to_their_rows_in_the_papers_order():
    assert [r.name for r in select_rows("C1,A,big")] == ["A1", "A2", "A3", "A4", "C1", "big"]


def test_smoke_budget_divides_sizes_by_eight_and_keeps_heads_and_layers():
    big = next(r for r in select_rows("big"))
    cfg = row_config(big, BUDGETS["smoke"], vocab_size=1000)
    assert (cfg.N, cfg.d_model, cfg.d_ff, cfg.h, cfg.d_k, cfg.d_v, cfg.P_drop) == (6, 128, 512, 16, 8, 8, 0.3)


def test_the_cpu_budgets_peak_is_bases_and_scales_with_each_rows_width_as_in_eq_3():
    cpu = BUDGETS["cpu"]
    peaks = {row.name: row_lr_peak(row, cpu) for row in select_rows("all")}
    assert peaks["base"] == peaks["C3"] == cpu.lr_peak  # same width: the budget's own peak, exactly
    assert peaks["C4"] == pytest.approx(cpu.lr_peak * 2**0.5) and peaks["C5"] == peaks["big"] == pytest.approx(
        cpu.lr_peak / 2**0.5
    )
    assert row_lr_peak(select_rows("C5")[0], BUDGETS["smoke"]) is None  # eq. (3) itself depends on d_model


@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=60),
    max_tokens=st.integers(1, 120),
    seed=st.integers(0, 3),
)
@example(
    lengths=[(3, 4), (9, 8), (4, 3), (12, 10), (5, 6), (5, 4), (7, 9), (2, 1), (30, 2), (6, 5)], max_tokens=24, seed=3
)
def test_batches_cover_every_pair_once_within_the_token_limit(lengths, max_tokens, seed):
    src_lens, tgt_lens = [s for s, _ in lengths], [t for _, t in lengths]
    batches = bucketed_batches(src_lens, tgt_lens, max_tokens, seed, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        if len(b) > 1:  # a pair longer than the limit makes a batch of its own
            assert max(src_lens[i] for i in b) * len(b) <= max_tokens
            assert max(tgt_lens[i] + 1 for i in b) * len(b) <= max_tokens  # + 1: BOS / EOS
    assert batches == bucketed_batches(src_lens, tgt_lens, max_tokens, seed, epoch=0)


def test_batch_order_changes_from_epoch_to_epoch():
    lens = list(range(1, 30))
    assert bucketed_batches(lens, lens, 12, seed=0, epoch=0) != bucketed_batches(lens, lens, 12, seed=0, epoch=1)


def test_batch_adds_bos_to_the_decoder_input_and_eos_to_the_target():
    batch = make_batch([[5, 6, EOS], [7, EOS]], [[8, 9, 10], [11]])
    assert batch.tgt.tolist() == [[BOS, 8, 9, 10], [BOS, 11, PAD, PAD]]
    assert batch.labels.tolist() == [[8, 9, 10, EOS], [11, EOS, PAD, PAD]]
    assert batch.src_pad.tolist() == [[False] * 3, [False, False, True]]
    assert (batch.src_tokens, batch.tgt_tokens) == (5, 6)


def test_a_stream_resumed_from_its_position_yields_the_same_batches():
    src = [[i + 4] * (1 + i % 5) + [EOS] for i in range(40)]
    tgt = [[i + 4] * (1 + i % 3) for i in range(40)]
    whole = BatchStream(src, tgt, max_tokens=12, seed=0)
    seen = [whole.next().src.tolist() for _ in range(25)]  # crosses into the second epoch
    resumed = BatchStream(src, tgt, max_tokens=12, seed=0)
    for _ in range(9):
        resumed.next()
    position = resumed.position
    fresh = BatchStream(src, tgt, max_tokens=12, seed=0)
    fresh.seek(**position)
    assert [fresh.next().src.tolist() for _ in range(16)] == seen[9:]


@needs_data
def test_bpe_is_cached_by_a_hash_of_its_inputs(tmp_path):
    corpus = load_corpus("multi30k", REAL_DATA, max_train_pairs=300)
    sp = shared_bpe(corpus.train, 200, tmp_path)
    cached = list(tmp_path.glob("bpe-200-*.model"))
    assert len(cached) == 1 and sp.get_piece_size() == 200
    assert (sp.pad_id(), sp.bos_id(), sp.eos_id()) == (PAD, BOS, EOS)
    shared_bpe(corpus.train, 200, tmp_path)
    assert list(tmp_path.glob("bpe-*.model")) == cached  # same inputs: loaded, not retrained
    shared_bpe(corpus.train.head(200), 200, tmp_path)
    assert len(list(tmp_path.glob("bpe-*.model"))) == 2  # other inputs: another model


def test_a_bpe_made_on_one_machine_is_found_in_the_cache_on_another_with_more_cores(monkeypatch):
    pairs = Pairs(("a small sentence",), ("ein kleiner Satz",))
    here = bpe_key(pairs, 200)
    monkeypatch.setattr("os.cpu_count", lambda: 64)  # the GPU machine the prepared cache travels to
    assert bpe_key(pairs, 200) == here
