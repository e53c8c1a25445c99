"""Every mutant is caught, every property is seen to fail, and a mutant is a model spec like any other."""

import json

import pytest
from hypothesis import Phase, settings

from invariants.engine import ERROR, FAIL
from invariants.mutants import MUTANTS, build
from invariants.suite import BY_NAME, PROPERTIES, run_suite
from model import SpecError, TransformerConfig, load_model
from tests.helpers import REPO

SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"
REPORTS = REPO / "reports" / "invariants"
KILL_MATRICES = [REPORTS / "kill_matrix.json", REPORTS / "base" / "kill_matrix.json"]  # a small config, the base config


CONTROLS = [name for name, mutant in MUTANTS.items() if mutant.control]


@pytest.mark.parametrize("name", CONTROLS)
def test_a_correct_control_fails_no_property(name):
    results = run_suite(f"mutant:{name},{SMALL}", settings=settings(settings.default, max_examples=3))
    assert [(r.name, r.verdict, r.reason) for r in results if r.verdict in (FAIL, ERROR)] == []


def test_the_float32_control_is_judged_at_float32_precision_and_says_so():
    results = {
        r.name: r
        for r in run_suite(
            f"mutant:float32_softmax_and_loss,{SMALL}",
            [BY_NAME["permutation_encoder"], BY_NAME["loss_smoothed_minimum"]],
            settings=settings(settings.default, max_examples=3),
        )
    }
    assert "forward computes below float64 (aten." in results["permutation_encoder"].reason
    assert "gives float32" in results["permutation_encoder"].reason
    assert results["loss_smoothed_minimum"].tolerance == 1e-4 and results["loss_smoothed_minimum"].verdict == "pass"


# A failure found is the verdict asked for: shrinking it to a smallest case (up to a hundred more cases, most of this
# test's time on some mutants) changes the counterexample shown, not the verdict.
NO_SHRINK = [phase for phase in Phase if phase != Phase.shrink]


@pytest.mark.parametrize("name", [name for name in MUTANTS if name not in CONTROLS])
def test_mutant_fails_every_property_that_should_catch_it(name):
    spec = f"mutant:{name},{SMALL}"
    found = settings(settings.default, max_examples=3, phases=NO_SHRINK)
    results = [BY_NAME[prop](spec, settings=found) for prop in MUTANTS[name].caught_by]
    missed = [r.name for r in results if r.verdict != FAIL]
    assert not missed, f"{name} passed {missed}"


def test_every_property_is_killed_by_a_near_miss_mutant():
    near_misses = {prop for mutant in MUTANTS.values() if not mutant.known_bug for prop in mutant.caught_by}
    killed = {prop for mutant in MUTANTS.values() for prop in mutant.caught_by}
    assert killed == {p.name for p in PROPERTIES}
    assert len(near_misses) >= 15


def test_the_fourteen_known_bugs_are_all_mutants():
    assert sum(m.known_bug for m in MUTANTS.values()) == 14


def test_unknown_or_missing_mutant_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown mutant 'nope'; valid mutants: causal_off_by_one, no_causal_mask"):
        build(TransformerConfig(), "nope")
    with pytest.raises(SpecError, match="mutant needs a name.*valid mutants: causal_off_by_one") as info:
        load_model("mutant")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("path", KILL_MATRICES, ids=["small", "base"])
def test_committed_kill_matrix_covers_every_mutant_and_property_and_catches_all_by_a_fail(path):
    kill = json.loads(path.read_text())
    assert kill["mutants"] == list(MUTANTS)
    assert kill["properties"] == [p.name for p in PROPERTIES]
    assert kill["controls"] == CONTROLS
    assert all(any(v == FAIL for v in kill["verdicts"][m].values()) for m in kill["mutants"] if m not in CONTROLS)
    assert not any(v in (FAIL, ERROR) for m in CONTROLS for v in kill["verdicts"][m].values())
    assert all(kill["verdicts"][m][p] == FAIL for m in kill["mutants"] for p in MUTANTS[m].caught_by)
