"""The paper's exact sub-layers: the FFN is eq. (2) with ReLU, dropout acts only at section 5.4's sites, and every kind
of attention divides its logits by sqrt(d_k). Each check passes a correct model and fails the near miss it targets."""

import pytest
import torch

from invariants import attention_scaling, dropout_sites, ffn_relu
from invariants.properties.behaviour import KINDS, logit_spreads
from invariants.engine import FAIL, PASS
from invariants.properties.feedforward import feed_forward_parts, lowered, rescaled
from invariants.subject import Subject
from invariants.properties.dropout import proportional_sublayers, signs
from tests.helpers import few

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch.nn's nested-tensor notes
SMALL = "N=2,d_model=16,h=2,d_k=8,d_v=8,d_ff=64,vocab_size=50"


@pytest.mark.parametrize("spec", ["reference", "torch-nn"])
def test_a_relu_feed_forward_passes_ffn_relu_to_the_last_bit(spec):
    result = ffn_relu(f"{spec},{SMALL}", settings=few())
    assert result.verdict == PASS and result.worst_error == 0.0


def test_gelu_in_the_feed_forward_fails_ffn_relu_as_not_positively_homogeneous():
    result = ffn_relu(f"mutant:ffn_gelu,{SMALL}", settings=few())
    assert result.verdict == FAIL and result.worst_error > 1e-3 and "not positively homogeneous" in result.reason


def test_a_leaky_relu_passes_the_rescaling_but_fails_ffn_relu_below_zero():
    result = ffn_relu(f"mutant:ffn_leaky_relu,{SMALL}", settings=few())
    assert result.verdict == FAIL and "not 0 below 0" in result.reason
    assert "not positively homogeneous" not in result.reason


def test_the_ffn_matrices_are_those_with_a_d_ff_axis_w1_the_one_beside_b1():
    model = Subject(f"reference,{SMALL}").model()
    firsts, biases, seconds = feed_forward_parts(model)
    ffns = [layer.ffn for layer in [*model.encoder, *model.decoder]]
    assert [id(w) for w in firsts] == [id(f.w_1.weight) for f in ffns]
    assert [id(b) for b in biases] == [id(f.w_1.bias) for f in ffns]
    assert [id(w) for w in seconds] == [id(f.w_2.weight) for f in ffns]


def test_rescaling_and_lowering_the_ffns_put_every_parameter_back_bit_for_bit():
    model = Subject(f"reference,{SMALL}").model()
    before = {name: p.clone() for name, p in model.named_parameters()}
    parts = feed_forward_parts(model)
    with rescaled(*parts, 0.25), lowered(parts[0], parts[1], 16, 2.0):
        assert not torch.equal(model.encoder[0].ffn.w_1.bias, before["encoder.0.ffn.w_1.bias"])
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_ffn_relu_skips_the_config_where_d_ff_cannot_tell_the_ffn_apart_and_judges_the_drawn_ones():
    result = ffn_relu("reference,N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=16,vocab_size=50", settings=few(1))
    assert result.verdict == PASS and "cases skipped: the spec's own config (at d_ff=16, d_model=16" in result.reason


@pytest.mark.parametrize("mutant", ["attention_probs_dropped", "ffn_activations_dropped"])
def test_dropout_inside_attention_or_the_ffn_fails_dropout_sites(mutant):
    result = dropout_sites(f"mutant:{mutant},{SMALL}", settings=few())
    assert result.verdict == FAIL and "0.0% as computed" in result.reason and "inside attention" in result.reason


@pytest.mark.parametrize("mutant", ["ffn_output_not_dropped", "attention_output_dropped_twice"])
def test_a_sub_layer_output_dropped_not_at_all_or_twice_fails_dropout_sites(mutant):
    result = dropout_sites(f"mutant:{mutant},{SMALL}", settings=few())
    assert result.verdict == FAIL and "dropped twice or not at all" in result.reason


def test_torch_nn_drops_attention_probabilities_and_ffn_activations_so_it_fails_dropout_sites():
    # nn.Transformer(dropout=p) also passes p to nn.MultiheadAttention and between the FFN's two linear maps.
    assert dropout_sites(f"torch-nn,{SMALL}", settings=few()).verdict == FAIL
    assert dropout_sites(f"reference,{SMALL}", settings=few()).verdict == PASS


def test_the_dropout_pattern_keeps_one_position_rows_in_the_span_of_u_and_w():
    model = proportional_sublayers(Subject(f"reference,{SMALL}"), {})
    u, w = signs(16, 16), signs(16, 16, first=4)
    with torch.no_grad(), model.positional_encoding(False):
        out = model.encode((3.0 * u + 2.0 * w).expand(2, 1, 16), torch.zeros(2, 1, dtype=torch.bool))
    along = (out @ u)[..., None] * u / u.dot(u) + (out @ w)[..., None] * w / w.dot(w)
    assert out.abs().max() > 1 and (out - along).abs().max() < 1e-9 * out.abs().max()


def test_attention_logit_spreads_are_measured_for_each_kind_of_attention():
    spreads = logit_spreads(Subject("reference"), {"N": 2, "d_model": 32, "d_ff": 64, "vocab_size": 100}, 0)
    assert set(spreads) == set(KINDS) and all(0 < s < 10 for s in spreads.values())


def test_cross_attention_without_its_scaling_fails_attention_scaling_naming_cross_attention():
    result = attention_scaling("mutant:cross_attention_unscaled", settings=few(1))
    assert result.verdict == FAIL and "cross (" in result.reason
    assert "encoder_self (" not in result.reason and "decoder_self (" not in result.reason
