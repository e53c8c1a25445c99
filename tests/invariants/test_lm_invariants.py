"""The decoder-only checks: the reference passes them, every decoder-only mutant is caught by the properties named
for it, and the CLI takes a decoder-only spec as it takes any other."""

import pytest
from hypothesis import Phase, settings

from invariants.__main__ import main
from invariants.engine import ERROR, FAIL, NOT_APPLICABLE, PASS
from invariants.lm.cases import LMCase
from invariants.lm.mutants import LM_MUTANTS
from invariants.lm.properties import LM_PROPERTIES
from invariants.lm.subject import LMSubject
from invariants.profiles import EXAMPLES
from invariants.suite import run_suite

BY_NAME = {p.name: p for p in LM_PROPERTIES}
QUICK = settings(settings.default, max_examples=3, phases=[p for p in Phase if p != Phase.shrink])
# A mutant's verdict under the suite's own count of drawn cases (profile ci), without shrinking the failure found.
AS_THE_SUITE = settings(QUICK, max_examples=EXAMPLES["ci"])
BUGS = [name for name, mutant in LM_MUTANTS.items() if not mutant.control]


@pytest.mark.parametrize("spec", ["lm-reference", "lm-reference:modern,window=3"])
def test_the_reference_fails_no_property_and_skips_only_what_its_config_lacks(spec):
    results = run_suite(LMSubject(spec), LM_PROPERTIES, settings=QUICK)
    assert [(r.name, r.verdict, r.reason) for r in results if r.verdict in (FAIL, ERROR)] == []
    skipped = {r.name for r in results if r.verdict == NOT_APPLICABLE}
    lacks = {"sliding_window", "rotary_relative", "rotary_rotation"} if spec == "lm-reference" else {"tied_embeddings"}
    assert skipped == lacks


@pytest.mark.parametrize("name", BUGS)
def test_decoder_only_mutant_fails_every_property_that_should_catch_it(name):
    subject = LMSubject(f"lm-mutant:{name}")
    missed = [p for p in LM_MUTANTS[name].caught_by if BY_NAME[p](subject, settings=AS_THE_SUITE).verdict != FAIL]
    assert not missed, f"{name} passed {missed}"


def test_every_decoder_only_property_is_killed_by_some_mutant():
    killed = {prop for mutant in LM_MUTANTS.values() for prop in mutant.caught_by}
    assert killed == {p.name for p in LM_PROPERTIES}


def test_the_cli_checks_a_decoder_only_spec_and_writes_its_report(tmp_path, capsys):
    status = main(
        ["--model", "lm-reference", "--only", "causal_future_tokens,attention_scores", "--out", str(tmp_path)]
    )
    assert status == 0
    assert "2 of 17 properties (--only)" in (tmp_path / "lm-reference.partial.md").read_text()


def test_a_bad_decoder_only_spec_is_one_line_and_status_2(tmp_path, capsys):
    assert main(["--model", "lm-reference:nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown decoder-only preset 'nope'" in err


def test_a_decoder_only_property_name_is_checked_against_the_decoder_only_list(tmp_path, capsys):
    assert main(["--model", "lm-reference", "--only", "permutation_encoder", "--out", str(tmp_path)]) == 2
    assert "unknown property permutation_encoder; valid: causal_future_tokens" in capsys.readouterr().err


def test_a_passing_verdict_is_a_pass_on_the_hf_llama_adapter_judged_at_float32():
    pytest.importorskip("transformers")
    result = BY_NAME["attention_scores"](LMSubject("hf-llama"), settings=QUICK)
    assert result.verdict == PASS and result.tolerance == 1e-4 and "float32" in result.reason


@pytest.mark.parametrize("window, departs", [(1, True), (2, False), (3, False)])
def test_hf_mistral_generation_departs_from_its_full_pass_at_window_1_only(window, departs):
    """HF's sliding-window cache (transformers 4.57.6, cache_utils.py:207) keeps keys[-window + 1:], every key when
    window is 1 (-0 is 0), while its mask is sized for window - 1 kept keys: a real departure, not the harness's."""
    pytest.importorskip("transformers")
    subject = LMSubject(f"hf-mistral,window={window},n_layers=2,d_model=8,n_heads=2,n_kv_heads=1")
    errors = [
        BY_NAME["greedy_generation"].check(subject, LMCase({}, 2, 3, False, "left", False, s))[0] for s in range(4)
    ]
    assert (max(errors) > 1e-4) == departs


NEWCOMER = "tests/invariants/newcomer_lm.py:build,rotary_layout=half,norm=rmsnorm,norm_position=pre"


@pytest.mark.parametrize(
    "extra", [",positions=rotary,ffn=swiglu,n_kv_heads=2,tie_embeddings=false,window=4", ",positions=none,ffn=gelu"]
)
def test_a_model_written_from_the_docs_alone_fails_no_property(extra):
    results = run_suite(LMSubject(NEWCOMER + extra), LM_PROPERTIES, settings=QUICK)
    assert [(r.name, r.verdict, r.reason) for r in results if r.verdict in (FAIL, ERROR)] == []


def test_a_decoder_only_factory_without_its_annotation_is_told_to_add_it(tmp_path, capsys):
    factory = tmp_path / "unannotated.py"
    factory.write_text("from model.lm.reference import DecoderOnly\n\ndef build(cfg):\n    return DecoderOnly(cfg)\n")
    assert main(["--model", f"{factory}:build,positions=rotary", "--out", str(tmp_path)]) == 2
    assert "a decoder-only factory annotates its argument: def build(cfg: LMConfig)" in capsys.readouterr().err
