"""Replays: the command names nox inside `nox -s invariants`, and a replayed case that no longer fails is a pass."""

from __future__ import annotations

from invariants.engine import FIXED, PASS, invocation
from invariants.properties.dropout import dropout_sites

SMALL = "N=2,d_model=64,h=4,d_k=16,d_v=16,d_ff=128,vocab_size=1000"
BLOB = (
    "6.170.15",
    b"AEEBQQFBAkEAQQBBAA==",
)  # dropout_sites' failing case on tests/invariants/broken/causal_hides_diagonal.py


def test_the_replay_command_is_the_nox_session_inside_it_and_the_module_elsewhere(monkeypatch):
    monkeypatch.delenv("NOX_CURRENT_SESSION", raising=False)
    assert invocation() == "python -m invariants"
    monkeypatch.setenv("NOX_CURRENT_SESSION", "invariants")
    assert invocation() == "nox -s invariants --"


def test_a_replayed_case_that_now_passes_is_a_pass_saying_it_is_fixed():
    result = dropout_sites(f"reference,{SMALL}", replay=BLOB)
    assert result.verdict == PASS and result.reason.startswith(FIXED), result.reason
