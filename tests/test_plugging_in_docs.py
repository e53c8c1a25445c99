"""docs/plugging-in.md is tested the way it is used: the second worked example is built from the page's own code block
and passes the cache and attention checks it claims; the config table lists every TransformerConfig field."""

from __future__ import annotations

from invariants.engine import FAIL, PASS
from invariants.suite import run_suite, select
from model.config import field_names
from tests.helpers import REPO, doc_block

PAGE = REPO / "docs" / "plugging-in.md"
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50,max_len=64"
CLAIMED = ["cached_decoding", "causal_future_probs", "softmax_rows", "padding_probs_zero", "causal_future_tokens"]


def test_the_scratch_example_supports_the_cache_and_capture_and_passes_their_checks(tmp_path):
    (tmp_path / "scratch.py").write_text(doc_block("# scratch.py"))
    results = run_suite(f"{tmp_path / 'scratch.py'}:make,{SMALL}", select(CLAIMED))
    assert [r.verdict for r in results] == [PASS] * len(CLAIMED), {r.name: r.reason for r in results}


def test_the_scratch_example_with_the_pages_layout_members_passes_the_oracle_and_a_bug_is_localised(tmp_path):
    members = doc_block("from dataclasses import replace") + "\n" + doc_block("from model.paper_params import sublayer")
    attach = "\nScratch.paper_params, Scratch.paper_sublayers = paper_params, paper_sublayers\n"
    (tmp_path / "scratch.py").write_text(doc_block("# scratch.py") + "\n" + members + attach)
    oracle = select(["oracle_encoder", "oracle_decoder", "oracle_logits", "oracle_cached_decoding"])
    results = run_suite(f"{tmp_path / 'scratch.py'}:make,{SMALL}", oracle)
    assert [r.verdict for r in results] == [PASS] * len(oracle), {r.name: r.reason for r in results}
    source = (tmp_path / "scratch.py").read_text()
    assert source.count("nn.ReLU()") == 1
    (tmp_path / "gelu.py").write_text(source.replace("nn.ReLU()", "nn.GELU()"))  # eq. (2)'s max(0, .) swapped
    (encoder,) = run_suite(f"{tmp_path / 'gelu.py'}:make,{SMALL}", select(["oracle_encoder"]))
    assert encoder.verdict == FAIL and "first departs at encoder.0.ffn (" in encoder.reason, encoder.reason


def test_the_config_table_names_every_field():
    text = PAGE.read_text()
    table = text.split("### The config fields")[1].split("###")[0]
    missing = [f for f in field_names() if f"`{f}`" not in table]
    assert not missing, missing
