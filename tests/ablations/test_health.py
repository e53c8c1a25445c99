"""Whether a run learned, judged against its data's baseline: the unigram plateau and a uniform guess."""

import math
from types import SimpleNamespace

import pytest

from ablations.grid import health


@pytest.mark.parametrize(
    "ppl, expected",
    [(30.0, "learns"), (250.0, "plateau"), (8600.0, "collapsed"), (float("nan"), "collapsed"), (None, "collapsed")],
)
def test_a_run_is_judged_by_its_last_dev_perplexity_against_the_unigram_and_uniform_ones(ppl, expected):
    assert health.Baseline(unigram_ppl=400.0, vocab=2000, dev_pairs=10).verdict(ppl) == expected


def test_the_unigram_baseline_predicts_each_dev_token_by_its_add_one_training_frequency():
    # Training targets hold token 1 twice and token 2 once; with add-one over a vocabulary of 3 the model gives
    # p(1) = 3/6 and p(2) = 2/6, so the dev sentence [1, 2] has PPL exp(-(ln 1/2 + ln 1/3) / 2) = sqrt(6).
    data = SimpleNamespace(train_tgt=[[1, 1, 2]], dev_tgt=[[1, 2]], sp=SimpleNamespace(get_piece_size=lambda: 3))
    baseline = health.measure(data)
    assert baseline.unigram_ppl == pytest.approx(math.sqrt(6)) and (baseline.vocab, baseline.dev_pairs) == (3, 1)


def test_a_published_baseline_reads_back_and_a_missing_one_is_none(tmp_path):
    assert health.read(tmp_path) is None
    written = health.Baseline(unigram_ppl=445.7, vocab=2000, dev_pairs=1014)
    health.write(tmp_path, written)
    assert health.read(tmp_path) == written


@pytest.mark.parametrize("text", ["{not json", '{"unigram_ppl": 445.7}', "[1, 2]"])
def test_a_damaged_baseline_is_a_one_line_error_naming_the_file_and_the_fix(tmp_path, text):
    (tmp_path / health.PUBLISHED).write_text(text)
    with pytest.raises(ValueError) as raised:
        health.read(tmp_path)
    message = str(raised.value)
    assert "\n" not in message and str(tmp_path / health.PUBLISHED) in message
    assert "rerun: python -m ablations publish" in message
