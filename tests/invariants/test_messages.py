"""Failure messages point at the cause: the attention kind, layer, head and query position; the failing case in words;
which number is the error; and a failure that follows from another failing property names it."""

from __future__ import annotations

from invariants.properties.causal import causal_future_tokens, causal_jacobian
from invariants.engine import FAIL
from invariants.properties.softmax import softmax_rows
from invariants.properties.dropout import dropout_sites
from tests.helpers import REPO

SMALL = "N=2,d_model=64,h=4,d_k=16,d_v=16,d_ff=128,vocab_size=1000"
DIAGONAL = f"{REPO / 'tests/invariants/broken/causal_hides_diagonal.py'}:make,{SMALL}"


def test_softmax_rows_names_the_row_and_what_else_fails_because_of_it():
    result = softmax_rows(DIAGONAL)
    assert result.verdict == FAIL
    assert "with the decoder's input embeddings times 1" in result.reason  # the case's trailing number, in words
    assert "decoder self-attention, layer 0, head 0, query position 0 (batch row 0), which sums to 0" in result.reason
    assert "hide the diagonal" in result.reason and "consequence: dropout_sites" in result.reason


def test_dropout_sites_says_its_failure_follows_from_a_row_with_nothing_to_attend_to():
    result = dropout_sites(DIAGONAL)
    assert result.verdict == FAIL and "on the failing case Case(N=2," in result.reason
    assert "std, the error measured here" in result.reason
    assert "likely a consequence of another failure, not of dropout" in result.reason
    assert "softmax_rows fails on this" in result.reason


def test_causal_future_tokens_names_the_position_that_saw_the_future():
    result = causal_future_tokens(f"mutant:heads_by_reshape,{SMALL}")
    assert result.verdict == FAIL and "moved the logits at position" in result.reason


def test_a_leak_through_the_mask_names_the_attention_row_that_sees_the_future():
    result = causal_future_tokens(f"mutant:no_causal_mask,{SMALL}")
    assert result.verdict == FAIL and "decoder self-attention, layer " in result.reason
    assert "the causal mask lets it see the future" in result.reason


def test_a_leak_after_the_softmax_says_the_weights_are_causal_and_points_at_the_head_merge():
    for check in (causal_future_tokens, causal_jacobian):
        result = check(f"mutant:heads_merged_by_reshape,{SMALL}")
        assert result.verdict == FAIL, check.name
        assert "captured weights on later keys are all 0, so the leak comes after the softmax" in result.reason
        assert "where heads are split or merged" in result.reason
