"""docs/plugging-in.md is tested the way it is used: the second worked example is built from the page's own code block
and passes the cache and attention checks it claims; the config table lists every TransformerConfig field."""

from __future__ import annotations

import re

from invariants.engine import PASS
from invariants.suite import run_suite, select
from model.config import field_names
from tests.helpers import REPO

PAGE = REPO / "docs" / "plugging-in.md"
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50,max_len=64"
CLAIMED = ["cached_decoding", "causal_future_probs", "softmax_rows", "padding_probs_zero", "causal_future_tokens"]


def doc_block(first_line: str) -> str:
    blocks = re.findall(r"^```\w*\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    return next(block for block in blocks if block.startswith(first_line))


def test_the_scratch_example_supports_the_cache_and_capture_and_passes_their_checks(tmp_path):
    (tmp_path / "scratch.py").write_text(doc_block("# scratch.py"))
    results = run_suite(f"{tmp_path / 'scratch.py'}:make,{SMALL}", select(CLAIMED))
    assert [r.verdict for r in results] == [PASS] * len(CLAIMED), {r.name: r.reason for r in results}


def test_the_config_table_names_every_field():
    text = PAGE.read_text()
    table = text.split("### The config fields")[1].split("###")[0]
    missing = [f for f in field_names() if f"`{f}`" not in table]
    assert not missing, missing
