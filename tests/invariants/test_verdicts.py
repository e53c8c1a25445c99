"""The invariants suite on correct models: the reference passes everything, torch.nn.Transformer gets its
documented verdicts, and missing capabilities are reported as not applicable with the reason."""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from invariants import (
    causal_future_probs,
    dropout_active,
    ffn_nonlinear,
    fully_padded_rows,
    loss_eps_zero_is_nll,
    loss_pad_normalisation,
    loss_smoothed_minimum,
    params_table3,
    pe_exact_values,
    pe_relative_linearity,
    permutation_positive_control,
    run_suite,
)
from invariants import tolerances as tol
from invariants.engine import ERROR, FAIL, NOT_APPLICABLE, PASS, Property, Subject
from invariants.measure import without_sublayer_weights
from invariants.properties.feedforward import affine_span_excess
from invariants.properties.dropout import two_hot
from invariants.__main__ import parse_replay
from model import SpecError, Transformer
from model.adapters.torch_nn import TorchTransformer
from model.objective import learning_rate
from model.transformer import Parts
from tests.helpers import few

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch.nn's nested-tensor notes
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"
# Drawn cases per property on top of the pinned ones: few, to keep CI fast; more under the thorough profile.
EXAMPLES = 50 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 3


def verdicts(results) -> dict[str, str]:
    return {r.name: r.verdict for r in results}


@pytest.mark.slow
def test_reference_model_passes_every_invariant():
    results = run_suite(f"reference,{SMALL}", settings=few(EXAMPLES))
    failed = [f"{r.name}: {r.reason}" for r in results if r.verdict != PASS]
    assert not failed, failed


@pytest.mark.slow
def test_torch_nn_transformer_gets_its_documented_verdicts():
    # Real findings about torch.nn.Transformer 2.13 (docs/invariants.md, "Findings on real models"): no KV cache,
    # rows B1/B2 unbuildable, a fully padded source or target row gives NaN logits and gradients when attention
    # weights are requested, and its one dropout rate also drops attention probabilities and FFN activations.
    # A user observes these NaNs (in the loss's gradients), so they are judged, unlike the dead rows' own values.
    results = run_suite(f"torch-nn,{SMALL}", settings=few(EXAMPLES))
    expected = {r.name: PASS for r in results}
    expected.update(cached_decoding=NOT_APPLICABLE, fully_padded_rows=FAIL, dropout_sites=FAIL)
    # The oracle: torch's final LayerNorm on each stack (encoder.output, decoder.output), and no cache to compare.
    expected.update(oracle_encoder=FAIL, oracle_decoder=FAIL, oracle_logits=FAIL, oracle_cached_decoding=NOT_APPLICABLE)
    expected.update(paper_parameters=FAIL)  # the final LayerNorm on each stack: parameters the paper lacks
    assert verdicts(results) == expected
    by_name = {r.name: r for r in results}
    assert "no incremental decoding" in by_name["cached_decoding"].reason
    assert (
        by_name["fully_padded_rows"].worst_error > 0 and "non-finite gradients" in by_name["fully_padded_rows"].reason
    )
    assert "attention probabilities requested" in by_name["fully_padded_rows"].reason
    assert "B1" in by_name["params_table3"].reason and "B2" in by_name["params_table3"].reason
    assert (
        "0.0% as computed" in by_name["dropout_sites"].reason and "inside attention" in by_name["dropout_sites"].reason
    )


def test_torch_nn_keeps_fully_padded_rows_finite_when_no_attention_weights_are_requested():
    def without_capture(config):
        model = TorchTransformer(config.replace(N=1, d_model=16, h=2, d_k=8, d_v=8, d_ff=32, vocab_size=50))
        model.unsupported = {**model.unsupported, "attention_probs": "not requested in this test"}
        return model

    assert fully_padded_rows(without_capture, settings=few(EXAMPLES)).verdict == PASS


def test_learned_positional_encoding_is_measured_not_sinusoidal_with_a_fit_over_more_positions_than_dimensions():
    result = pe_relative_linearity(f"reference,{SMALL},pe=learned", settings=few(EXAMPLES))
    assert result.verdict == NOT_APPLICABLE
    assert "not sinusoidal" in result.reason and "fitted over 1023 positions > 16 dimensions" in result.reason


def test_a_sinusoidal_table_is_judged_even_when_the_config_says_learned():
    def sinusoidal_but_says_learned(config):
        model = small_factory(config)
        model.config = model.config.replace(pe="learned")
        return model

    assert pe_exact_values(sinusoidal_but_says_learned, settings=few(EXAMPLES)).verdict == PASS


def annotated_float32_table(positions: int, d_model: int) -> torch.Tensor:
    """The sinusoids as the Annotated Transformer computes them: frequencies from exp and log, all in float32."""
    position = torch.arange(positions).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    table = torch.zeros(positions, d_model)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * frequency), torch.cos(position * frequency)
    return table


@pytest.mark.slow
def test_a_sinusoid_table_computed_in_float32_passes_the_pe_checks():
    def annotated(config):
        return Transformer(config, Parts(position_table=annotated_float32_table))

    for prop in (pe_exact_values, pe_relative_linearity):
        assert prop(annotated, settings=few(EXAMPLES)).verdict == PASS, prop.__name__


def test_no_positional_encoding_makes_the_pe_checks_not_applicable():
    subject = Subject(f"reference,{SMALL},pe=none")
    for prop in (pe_exact_values, permutation_positive_control):
        result = prop(subject, settings=few(EXAMPLES))
        assert (result.verdict, result.reason) == (NOT_APPLICABLE, "positional_table: pe='none'")


def test_a_capability_the_model_lacks_is_not_applicable_never_a_silent_pass():
    def fused_only(config):
        model = Transformer(config.replace(N=1, d_model=16, h=2, d_k=8, d_v=8, d_ff=32, vocab_size=50))
        model.unsupported = {"attention_probs": "fused kernel only"}
        return model

    result = causal_future_probs(fused_only, settings=few(EXAMPLES))
    assert (result.verdict, result.reason, result.examples) == (NOT_APPLICABLE, "attention_probs: fused kernel only", 0)


def test_ffn_check_is_not_applicable_where_normalisation_alone_could_fill_d_model():
    result = ffn_nonlinear("reference,N=2,d_model=8,h=2,d_k=4,d_v=4,d_ff=32,vocab_size=50", settings=few(EXAMPLES))
    assert result.verdict == NOT_APPLICABLE and "leaves no room above 10 affine dimensions" in result.reason


def test_a_stack_linear_between_its_normalisations_stays_within_the_bound():
    """The bound ffn_nonlinear uses: four LayerNorm(affine(x)) steps lift a plane to at most 2 + 4 affine dimensions."""
    gen = torch.Generator().manual_seed(0)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    rows = draw(64, 2) @ draw(2, 16)
    for _ in range(4):  # two encoder layers without activations, two normalisations each
        rows = torch.nn.functional.layer_norm(rows @ draw(16, 16) + draw(16), (16,))
    assert affine_span_excess(rows, 2 + 4) < 1e-13
    assert affine_span_excess(torch.relu(rows @ draw(16, 16)), 2 + 4) > 1e-3


def kl_to_smoothed(logits, target, pad_id, eps):
    """The Annotated Transformer's loss: KL divergence to eps / (V - 2) on every token but the true one and padding."""
    log_probs, flat = torch.log_softmax(logits, -1).flatten(0, 1), target.flatten()
    q = torch.full_like(log_probs, eps / (logits.size(-1) - 2)).scatter_(1, flat[:, None], 1 - eps)
    q[:, pad_id] = 0
    q[flat == pad_id] = 0
    return torch.nn.functional.kl_div(log_probs, q, reduction="sum") / (flat != pad_id).sum()


def fairseq_smoothed(logits, target, pad_id, eps):
    """fairseq's label_smoothed_nll_loss: eps / (V - 1) to each token other than the true one."""
    log_probs, flat = torch.log_softmax(logits, -1).flatten(0, 1), target.flatten()
    keep, other = flat != pad_id, eps / (logits.size(-1) - 1)
    loss = -(1 - eps - other) * log_probs.gather(1, flat[:, None])[:, 0] - other * log_probs.sum(-1)
    return loss[keep].sum() / keep.sum()


@pytest.mark.parametrize("loss", [kl_to_smoothed, fairseq_smoothed])
def test_label_smoothing_in_each_common_convention_passes_the_loss_checks(loss):

    def factory(cfg):  # a user's model at a small size of their own (the loss does not depend on it)
        return Transformer(cfg.replace(N=1, d_model=16, h=2, d_k=8, d_v=8, d_ff=32), Parts(loss=loss))

    results = [
        check(factory, settings=few(EXAMPLES))
        for check in (loss_smoothed_minimum, loss_eps_zero_is_nll, loss_pad_normalisation)
    ]
    assert [r.verdict for r in results] == [PASS] * 3, [r.reason for r in results]


def test_two_hot_probes_are_fixed_points_of_layer_norm_up_to_scale():
    """residual_dropout relies on it: an embedding LayerNorm before the embedding dropout keeps a probe two-hot."""
    probes = two_hot(4, 3, 16, torch.Generator().manual_seed(0))
    normalised = torch.nn.functional.layer_norm(probes, (16,))
    assert torch.allclose(
        normalised * probes.abs().amax(-1, keepdim=True) / normalised.abs().amax(-1, keepdim=True), probes
    )
    assert ((probes != 0).sum(-1) == 2).all() and (probes.sum(-1) == 0).all()


def test_zeroing_the_sublayers_keeps_the_layer_norms():
    model = without_sublayer_weights(Subject(f"reference,{SMALL}"), {}, biases=True)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    linears = [m for m in [*model.encoder.modules(), *model.decoder.modules()] if isinstance(m, torch.nn.Linear)]
    assert norms and all((n.weight == 1).all() for n in norms)
    assert linears and all(not lin.weight.any() and not lin.bias.any() for lin in linears)


def test_dropout_check_is_not_applicable_without_dropout():
    result = dropout_active(f"reference,{SMALL},P_drop=0.0", settings=few(EXAMPLES))
    assert result.verdict == NOT_APPLICABLE and "P_drop=0.0" in result.reason


def schedule_error(schedule, d_model: int, warmup: int) -> float:
    """Largest relative deviation of a schedule from eq. (3) over steps 1 .. 3 * warmup: the peak
    d_model^-0.5 * warmup^-0.5 at step = warmup, linear warm-up before it, step^-0.5 decay after it."""
    peak = d_model**-0.5 * warmup**-0.5
    steps = range(1, 3 * warmup + 1)
    rates = [schedule(s, d_model, warmup) for s in steps]
    worst = max(abs(rates[warmup - 1] / peak - 1), abs(max(rates) / peak - 1))
    for s, rate in zip(steps, rates):
        expected = peak * s / warmup if s <= warmup else peak * math.sqrt(warmup / s)
        worst = max(worst, abs(rate / expected - 1))
    return worst


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([16, 64, 256, 512, 1024]), st.integers(1, 2000))
def test_the_harness_learning_rate_follows_equation_3(d_model, warmup):
    # The ablation runner trains every model with this schedule: a property of the harness, not a model's verdict.
    assert schedule_error(learning_rate, d_model, warmup) <= tol.ANALYTIC.value


def test_schedule_check_fails_on_a_schedule_that_peaks_one_step_late():
    late = lambda step, d_model, warmup: learning_rate(step - 1, d_model, warmup)  # noqa: E731
    assert schedule_error(learning_rate, 512, 4000) <= tol.ANALYTIC.value
    assert schedule_error(late, 512, 4000) > tol.ANALYTIC.value


def test_a_model_that_builds_no_table3_row_is_not_applicable_for_table3():
    def only_small(config):
        if config.vocab_size != 37000:  # every Table 3 row is counted at the ~41K vocabulary its column implies
            raise SpecError(f"only the 37000-token vocabulary, not {config.vocab_size}")
        return small_factory(config)

    result = params_table3(only_small, settings=few(EXAMPLES))
    assert result.verdict == NOT_APPLICABLE and "builds no Table 3 row" in result.reason


def test_a_check_that_raises_is_an_error_not_a_failure():
    raises = Property(
        "raises", "0 test", "raises", lambda subject, x: 1 / 0, tol.Tolerance(5, "test"), pinned=lambda s: [0]
    )
    result = raises(Subject(f"reference,{SMALL}"))
    assert result.verdict == ERROR and "ZeroDivisionError" in result.reason


@pytest.mark.parametrize(
    "error, at_least, violated",
    [
        (0.0, False, False),
        (1e-3, False, True),
        (float("nan"), False, True),
        (1e-3, True, False),
        (0.0, True, True),
        (float("nan"), True, True),
    ],
)
def test_tolerance_verdicts_treat_nan_as_a_violation(error, at_least, violated):
    assert tol.Tolerance(1e-3 if at_least else 0.0, "test", at_least).violated(error) == violated


def test_a_drawn_failure_comes_with_a_replay_line_that_reproduces_it():
    at_most_5 = Property(
        "at_most_5",
        "0 test",
        "x <= 5",
        lambda subject, x: x,
        tol.Tolerance(5, "test"),
        cases=lambda subject: st.integers(0, 100),
    )
    subject = Subject(f"reference,{SMALL}")
    failed = at_most_5(subject, settings=settings(max_examples=50, derandomize=False), seed=3)
    assert failed.verdict == FAIL and failed.worst_error > 5
    assert "--seed 3" in failed.reproduce and "@reproduce_failure(" in failed.reproduce
    line = failed.reproduce.split('--replay "')[1].rstrip('"')
    replayed = at_most_5(subject, replay=parse_replay(line))
    assert replayed.verdict == FAIL and replayed.examples == 1


def small_factory(config):
    return Transformer(config.replace(N=1, d_model=16, h=2, d_k=8, d_v=8, d_ff=32, vocab_size=50))


def test_the_suite_runs_on_a_model_factory_as_well_as_a_spec():
    assert causal_future_probs(small_factory, settings=few(EXAMPLES)).verdict == PASS


def test_models_are_built_with_a_fixed_seed_so_runs_repeat():
    first, second = Subject(small_factory).model(), Subject(small_factory).model()
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
