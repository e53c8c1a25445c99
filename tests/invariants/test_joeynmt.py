"""JoeyNMT 2.3.0's Transformer behind the protocol (`joeynmt`): the paper's function (the oracle passes sub-layer by
sub-layer), with three findings of its own: dropout inside attention and the FFN, NaN for a fully padded row (a -inf
mask), and no KV cache. Its float32 label-smoothed target fails `loss_smoothed_minimum` by float32 rounding only."""

import pytest
import torch
from hypothesis import settings

for _needed in ("joeynmt", "yaml", "importlib_metadata", "sentencepiece", "subword_nmt"):  # its model modules' imports
    pytest.importorskip(_needed)

import model.adapters.joeynmt as joey_adapter  # noqa: E402  (registers the name `joeynmt`)
from invariants import contract, run_suite  # noqa: E402
from invariants.engine import FAIL, NOT_APPLICABLE, PASS  # noqa: E402
from invariants.properties.oracle import OracleCase, gap, localise, oracle_for, paper_decode, paper_encode  # noqa: E402
from invariants.suite import PROPERTIES  # noqa: E402
from model import SpecError, load_model  # noqa: E402
from model.protocol import PaperLayout, Seq2SeqModel  # noqa: E402

TINY = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"
SPEC = f"joeynmt,{TINY}"
PASSING = (
    "causal_future_tokens", "padding_probs_zero", "pe_exact_values", "embedding_scaling", "post_ln_order",
    "ffn_relu", "loss_eps_zero_is_nll", "loss_pad_normalisation", "params_tied_embeddings",
)  # fmt: skip
DEPARTURES = ("dropout_sites", "fully_padded_rows")


def few(examples: int) -> settings:  # as tests.helpers.few, which needs the grid extra
    return settings(settings.default, max_examples=examples)


def float64_target(config):
    """joeynmt with XentLoss's smoothed target (float32, loss.py:38) rebuilt in float64: nothing else changes."""
    model = joey_adapter.build(config)
    xent, original = model.joey.loss_function, model.joey.loss_function._reshape

    def reshape(log_probs, targets):
        flat, target = original(log_probs, targets)
        return flat, target.to(flat.dtype) if xent.smoothing <= 0 else rebuilt(targets, flat, xent)

    xent._reshape = reshape
    return model


def rebuilt(targets, flat, xent):
    t, V = targets.reshape(-1), flat.size(-1)
    d = torch.full((t.numel(), V), xent.smoothing / (V - 2), dtype=flat.dtype)
    d.scatter_(1, t[:, None], 1.0 - xent.smoothing)
    d[:, xent.pad_index] = 0
    d[t == xent.pad_index] = 0
    return d


@pytest.fixture(scope="module")
def results():
    chosen = [p for p in PROPERTIES if p.name in (*PASSING, *DEPARTURES, "cached_decoding", "loss_smoothed_minimum")]
    return {r.name: r for r in run_suite(SPEC, chosen, settings=few(1))}


def test_joeynmt_keeps_the_protocols_contract_and_the_papers_layout():
    model = load_model(SPEC)
    assert isinstance(model, Seq2SeqModel) and isinstance(model, PaperLayout)
    assert contract.check(lambda: load_model(SPEC).double()) == {}
    assert type(model.joey).__module__ == "joeynmt.model"  # built by JoeyNMT's own build_model
    assert model.paper_params().shared() and not model.paper_params().missing()
    assert set(model.paper_params().extras) == set()  # every parameter maps onto the paper's


@pytest.mark.parametrize("padding", ["none", "right"])
def test_joeynmt_is_the_papers_function_sub_layer_by_sub_layer(padding):
    model = load_model(SPEC.replace("N=1", "N=2")).double().eval()
    b = OracleCase({}, batch=3, src_len=6, tgt_len=5, padding=padding, seed=0).make_batch(model)
    o = oracle_for(model)
    paper = paper_decode(o, b.tgt, paper_encode(o, b.src, b.src_pad), b.src_pad, b.tgt_pad)
    assert gap(model(b.src, b.tgt, b.src_pad, b.tgt_pad), paper, b.tgt_pad) < 1e-12
    assert localise(model, o, b) == []  # paper_sublayers covers every site and none departs


def test_joeynmt_passes_the_core_properties(results):
    assert {name: results[name].verdict for name in PASSING} == {name: PASS for name in PASSING}


def test_joeynmts_departures_fail_and_it_has_no_kv_cache(results):
    assert {name: results[name].verdict for name in DEPARTURES} == {name: FAIL for name in DEPARTURES}
    assert "dropout where section 5.4 has none" in results["dropout_sites"].reason
    assert results["cached_decoding"].verdict == NOT_APPLICABLE
    assert "search.py:240" in results["cached_decoding"].reason


def test_the_float32_smoothed_target_is_the_only_gap_at_the_loss_minimum(results):
    plain = results["loss_smoothed_minimum"]
    assert plain.verdict == PASS or plain.worst_error < 1e-6  # float32 rounding of eps/(V-2), not a wrong target
    minimum = [p for p in PROPERTIES if p.name == "loss_smoothed_minimum"]
    exact = run_suite(f"{__name__}:float64_target,{TINY}", minimum, settings=few(1))
    assert exact[0].verdict == PASS


def test_pad_id_and_untied_embeddings_are_honoured():
    model = load_model(f"{SPEC},pad_id=7,share_embeddings=false")
    assert model.joey.pad_index == 7 and model.joey.loss_function.pad_index == 7
    e = model.embedding_weights()
    assert not e["source"][7].any() and len({w.data_ptr() for w in e.values()}) == 3


@pytest.mark.parametrize(
    "overrides, message",
    [
        ("h=2,d_k=4,d_v=8", "needs h\\*d_k == h\\*d_v == d_model"),
        ("h=2,d_k=8,d_v=8,pe=learned", "always adds sinusoidal positions"),
        ("h=2,d_k=8,d_v=8,max_len=6000", "has 5000 rows"),
    ],
)
def test_a_config_joeynmt_cannot_build_is_a_one_line_error(overrides, message):
    with pytest.raises(SpecError, match=message) as info:
        load_model(f"joeynmt,N=1,d_model=16,d_ff=32,vocab_size=50,{overrides}")
    assert "\n" not in str(info.value)
