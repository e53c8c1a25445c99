"""The checks of a block's wiring (section 3.1 and 5.4) tell apart what their older neighbours could not: the pre-LN order
from the paper's, and a missing embedding dropout from a present one (dropout inside a sub-layer: test_sublayers.py)."""

import pytest

from invariants import layer_norm_outputs, post_ln_order, residual_dropout
from invariants.engine import FAIL, PASS
from tests.helpers import few

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SMALL = "N=2,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"


def test_a_pre_ln_stack_ending_in_a_layer_norm_passes_layer_norm_outputs_but_fails_post_ln_order():
    spec = f"mutant:pre_ln_blocks,{SMALL}"
    assert layer_norm_outputs(spec, settings=few()).verdict == PASS
    result = post_ln_order(spec, settings=few())
    assert result.verdict == FAIL and result.worst_error < 1e-5 and "pre-LN" in result.reason


def test_without_dropout_on_the_embedding_sums_residual_dropout_fails_from_above():
    result = residual_dropout(f"mutant:no_embedding_dropout,{SMALL}", settings=few())
    assert result.verdict == FAIL and "100.0% as in eval" in result.reason and "not dropped" in result.reason
