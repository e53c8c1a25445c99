"""HuggingFace MarianMT and BART behind the protocol: correct models nobody here wrote pass every applicable property."""

import subprocess
import sys

import pytest
import torch

from invariants import ffn_relu, pe_exact_values, pe_relative_linearity, run_suite
from invariants.engine import FAIL, NOT_APPLICABLE, PASS
from model import SpecError, load_model
from tests.helpers import few

transformers = pytest.importorskip("transformers")
BartConfig, BartForConditionalGeneration = transformers.BartConfig, transformers.BartForConditionalGeneration
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SMALL = "N=2,d_model=32,h=4,d_k=8,d_v=8,d_ff=64,vocab_size=60"


def not_passed(results) -> dict[str, str]:
    return {r.name: r.verdict for r in results if r.verdict != PASS}


@pytest.mark.slow
def test_hf_marian_passes_every_property_but_the_papers_interleaved_layout():
    results = run_suite(f"hf-marian,{SMALL}", settings=few(2))
    assert not_passed(results) == {
        "pe_exact_values": FAIL,
        "oracle_encoder": FAIL,
        "oracle_decoder": FAIL,
        "oracle_logits": FAIL,
        "oracle_cached_decoding": FAIL,
    }  # the oracle: sin|cos concatenated
    layout = next(r for r in results if r.name == "pe_exact_values")
    assert "layout" in layout.reason and "concatenated" in layout.reason


@pytest.mark.slow
def test_hf_bart_passes_every_property_and_its_learned_positions_are_measured_not_sinusoidal():
    results = run_suite(f"hf-bart,{SMALL}", settings=few(2))
    assert not_passed(results) == {
        "pe_relative_linearity": NOT_APPLICABLE,
        "pe_exact_values": NOT_APPLICABLE,
        "oracle_encoder": FAIL,
        "oracle_decoder": FAIL,
        "oracle_logits": FAIL,
        "oracle_cached_decoding": FAIL,  # the oracle: BART's LayerNorm on the embeddings
        "paper_parameters": FAIL,  # that LayerNorm's gains and biases, beyond the paper
    }
    reason = next(r.reason for r in results if r.name == "pe_relative_linearity")
    assert "not sinusoidal" in reason and "fitted over 1023 positions > 32 dimensions" in reason


def test_a_model_saved_with_save_pretrained_loads_as_hf_path(tmp_path):
    original = load_model(f"hf-marian,{SMALL}")
    original.hf.save_pretrained(tmp_path)
    loaded = load_model(f"hf:{tmp_path}").eval()
    assert loaded.config.d_model == 32 and loaded.config.N == 2
    src, tgt = torch.randint(1, 60, (2, 5)), torch.randint(1, 60, (2, 4))
    pads = torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 4, dtype=torch.bool)
    assert torch.equal(loaded(src, tgt, *pads), original.eval()(src, tgt, *pads))
    assert pe_relative_linearity(f"hf:{tmp_path}", settings=few(2)).verdict == PASS
    assert pe_exact_values(f"hf:{tmp_path}", settings=few(2)).verdict == FAIL


def test_the_hf_specs_build_the_papers_relu_and_dropout_sites_where_hf_defaults_to_gelu():
    for spec in ("hf-marian", "hf-bart"):
        config = load_model(f"{spec},{SMALL}").hf.config
        assert (config.activation_function, config.attention_dropout, config.activation_dropout) == ("relu", 0.0, 0.0)


def test_a_saved_bart_with_hfs_default_gelu_fails_ffn_relu_a_true_deviation_from_eq_2(tmp_path):
    config = BartConfig(
        vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    assert config.activation_function == "gelu"
    BartForConditionalGeneration(config).save_pretrained(tmp_path)
    result = ffn_relu(f"hf:{tmp_path}", settings=few(2))
    assert result.verdict == FAIL and "not positively homogeneous" in result.reason


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "hf:no-such-org/no-such-model",
            "neither a folder written by save_pretrained nor a hub name in the local cache",
        ),
        ("hf", "hf needs a folder: hf:PATH"),
        ("hf-marian,h=8,d_k=16", "needs h\\*d_k == h\\*d_v == d_model"),
    ],
)
def test_bad_hf_specs_are_one_line(spec, message):
    with pytest.raises(SpecError, match=message) as info:
        load_model(spec)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_without_transformers_the_error_says_how_to_install_it():
    code = "import sys; sys.modules['transformers'] = None\nfrom model import load_model\nload_model('hf-bart')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "needs transformers, which is not installed: pip install .[hf]" in proc.stderr
