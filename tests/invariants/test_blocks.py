"""The checks of a block's wiring (section 3.1 and 5.4) tell apart what their older neighbours could not: the pre-LN order
from the paper's, a missing dropout site from a present one, and dropout inside a sub-layer from dropout on its output."""

import pytest
import torch

from invariants import dropout_every_sublayer, layer_norm_outputs, post_ln_order, residual_dropout
from invariants.engine import FAIL, PASS
from invariants.subject import Subject
from invariants.sublayer_dropout import along_u, proportional_sublayers, signs
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


def test_dropout_on_attention_probabilities_and_activations_leaves_every_sublayer_count_as_the_papers():
    # torch.nn.Transformer drops attention probabilities and FFN activations too, at P_drop, as the Annotated
    # Transformer does: neither is a dropout on a sub-layer's output, and neither may count as one.
    assert dropout_every_sublayer(f"torch-nn,{SMALL}", settings=few()).verdict == PASS


def test_one_dropout_more_or_less_on_a_kind_of_sub_layer_fails_dropout_every_sublayer_from_either_side():
    fewer = dropout_every_sublayer(f"mutant:ffn_output_not_dropped,{SMALL}", settings=few())
    more = dropout_every_sublayer(f"mutant:attention_output_dropped_twice,{SMALL}", settings=few())
    assert fewer.verdict == FAIL and "fewer dropout masks" in fewer.reason
    assert more.verdict == FAIL and "more dropout masks" in more.reason


def test_the_dropout_pattern_maps_a_stream_along_u_to_outputs_along_u():
    model = proportional_sublayers(Subject(f"reference,{SMALL}"), {})
    u = signs(16, 16)
    with torch.no_grad(), model.positional_encoding(False):
        out = model.encode(along_u(2, 5, 16, 2.0), torch.zeros(2, 5, dtype=torch.bool))
    off_u = out - (out @ u)[..., None] * u / u.dot(u)
    assert out.abs().max() > 1 and off_u.abs().max() < 1e-12
