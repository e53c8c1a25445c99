"""The README's results at a glance: what each headline counts."""

import json

from reports import glance


def test_the_kill_matrix_headline_counts_the_mutants_and_names_the_correct_controls_apart(tmp_path):
    matrix = {
        "mutants": ["no_causal_mask", "ffn_relu6", "float32_softmax_and_loss"],
        "controls": ["float32_softmax_and_loss"],
        "properties": ["causal_future_tokens", "ffn_relu"],
        "verdicts": {
            "no_causal_mask": {"causal_future_tokens": "fail", "ffn_relu": "pass"},
            "ffn_relu6": {"causal_future_tokens": "pass", "ffn_relu": "fail"},
            "float32_softmax_and_loss": {"causal_future_tokens": "pass", "ffn_relu": "pass"},
        },
        "config": "N=2",
        "commit": "abc1234",
    }
    (tmp_path / glance.KILL_MATRIX).write_text(json.dumps(matrix))
    row = glance.kill_matrix_row(tmp_path, tmp_path)
    assert "2 of 2 mutants caught" in row and "each failing 1 to 1 of 2 properties" in row
    assert "1 of 1 correct controls fail nothing" in row
