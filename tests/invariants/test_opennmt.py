"""OpenNMT-py 3.5.1 behind the protocol (model/adapters/opennmt.py): the adapter runs the library's own layers and
computes what the library's own forward computes; the checks find its pre-LN blocks, its extra FFN dropout and its
trainer's loss normalisation, and pass the attention, masking, positions, embeddings and cache."""

import importlib.util

import pytest
import torch
from hypothesis import settings
from torch import nn

if importlib.util.find_spec("onmt") is None:  # not importorskip: `import onmt` itself needs the data pipeline's deps
    pytest.skip("OpenNMT-py is not installed (pip install --no-deps OpenNMT-py==3.5.1)", allow_module_level=True)

import model.adapters.opennmt  # noqa: E402,F401  (registers "opennmt" until model/registry.py lists the module)
from invariants import (  # noqa: E402
    cached_decoding,
    causal_future_tokens,
    embedding_scaling,
    ffn_relu,
    loss_eps_zero_is_nll,
    padding_probs_zero,
    pe_exact_values,
    post_ln_order,
)
from invariants.engine import FAIL, PASS  # noqa: E402
from invariants.properties.oracle import oracle_encoder  # noqa: E402
from model import SpecError, load_model  # noqa: E402
from model.paper_params import load_paper_params  # noqa: E402
from model.protocol import missing_members  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
TINY = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=40,vocab_size=50"  # d_ff apart from 1-3 x d_model (ffn_relu)
SPEC = f"opennmt,{TINY}"


def few(examples: int) -> settings:  # tests.helpers.few, without the grid extra that tests.helpers imports
    return settings(settings.default, max_examples=examples)


def batch(seed: int = 0, B: int = 3, S: int = 6, T: int = 5):
    """Right-padded ids (OpenNMT takes lengths and pad ids) with their masks."""
    gen = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(1, 50, (B, S), generator=gen), torch.randint(1, 50, (B, T), generator=gen)
    src_pad, tgt_pad = torch.zeros_like(src, dtype=torch.bool), torch.zeros_like(tgt, dtype=torch.bool)
    src_pad[1, S - 2 :], tgt_pad[2, T - 2 :] = True, True
    return src.masked_fill(src_pad, 0), tgt.masked_fill(tgt_pad, 0), src_pad, tgt_pad


@pytest.fixture(scope="module")
def onmt():
    return load_model(SPEC).double().eval()


def test_the_adapter_satisfies_the_protocol_and_lacks_no_capability(onmt):
    assert missing_members(onmt) == [] and onmt.unsupported == {}
    src, tgt, src_pad, tgt_pad = batch()
    logits = onmt(src, tgt, src_pad, tgt_pad)
    assert logits.shape == (3, 5, 50) and logits.dtype == torch.float64
    assert onmt.encode(src, src_pad).shape == (3, 6, 16)
    w = onmt.embedding_weights()
    assert w["source"] is w["target"] is w["generator"]  # share_embeddings + share_decoder_embeddings


def test_encode_and_decode_compute_what_the_librarys_own_forward_computes(onmt):
    """The adapter's loops over OpenNMT's layers, masks from src_pad and tgt_pad, equal TransformerEncoder.forward and
    TransformerDecoder.forward, which take lengths and pad ids, bit for bit."""
    src, tgt, src_pad, tgt_pad = batch()
    lengths = (~src_pad).sum(1)
    memory, _, _ = onmt.encoder(src.unsqueeze(-1), lengths)
    assert torch.equal(onmt.encode(src, src_pad)[~src_pad], memory[~src_pad])
    onmt.decoder.init_state(src.unsqueeze(-1), memory, None)
    out, _ = onmt.decoder(tgt.unsqueeze(-1), memory, src_len=lengths)
    assert torch.equal(onmt.decode(tgt, memory, src_pad, tgt_pad)[~tgt_pad], onmt.generator(out)[~tgt_pad])


def test_with_its_own_weights_opennmt_is_the_harness_pre_ln_mutant():
    """What the oracle finds is pre-LN and nothing else: the reference wired pre-LN (mutant:pre_ln_blocks), given
    OpenNMT's weights and final norms, gives its logits up to OpenNMT's float32 softmax."""
    onmt = load_model(SPEC).double().eval()
    with torch.no_grad():
        for p in onmt.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))  # norms and biases away from 1 and 0
    mutant = load_model(f"mutant:pre_ln_blocks,{TINY}").double().eval()
    load_paper_params(mutant, onmt.paper_params())
    with torch.no_grad():
        for stack, final in ((mutant.encoder, onmt.encoder.layer_norm), (mutant.decoder, onmt.decoder.layer_norm)):
            stack[-1].final.load_state_dict(final.state_dict())
            stack[-1].final.eps = final.eps
    src, tgt, src_pad, tgt_pad = batch()
    gap = onmt(src, tgt, src_pad, tgt_pad) - onmt.generator.bias - mutant(src, tgt, src_pad, tgt_pad)
    assert gap[~tgt_pad].abs().max() < 1e-5


def test_the_ffn_drops_its_activations_a_site_section_5_4_does_not_have(onmt):
    ffn = onmt.encoder.transformer[0].feed_forward  # position_ffn.py:108-109
    seen = []
    handle = ffn.w_2.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        ffn.train()
        with torch.no_grad():
            ffn.w_1.bias.fill_(10.0)  # every unit active: a zero entering W2 is a dropout
            ffn(torch.randn(4, 8, 16, dtype=torch.float64))
    finally:
        handle.remove()
        ffn.eval()
    assert (seen[0] == 0).any()


def test_the_loss_is_losscomputes_sum_over_the_tokens_less_one_per_sentence(onmt):
    _, tgt, _, tgt_pad = batch()
    logits = torch.randn(3, 5, 50, dtype=torch.float64)
    summed = nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=0, reduction="sum",
                                         label_smoothing=0.1)  # fmt: skip
    assert torch.allclose(onmt.loss(logits, tgt).double(), summed / ((~tgt_pad).sum() - 3), rtol=1e-6)


@pytest.mark.parametrize(
    "prop", [causal_future_tokens, cached_decoding, padding_probs_zero, pe_exact_values, embedding_scaling, ffn_relu]
)
def test_the_properties_opennmt_keeps_pass(prop):
    assert prop(SPEC, settings=few(1)).verdict == PASS


def test_the_checks_find_pre_ln_and_the_trainers_normalisation():
    assert post_ln_order(SPEC, settings=few(1)).verdict == FAIL
    oracle = oracle_encoder(SPEC, settings=few(1))
    assert oracle.verdict == FAIL and "first departs at encoder.0.self_attention.input" in oracle.reason
    assert loss_eps_zero_is_nll(SPEC, settings=few(1)).verdict == FAIL  # divided by tokens - sentences


@pytest.mark.parametrize(
    "overrides, message",
    [
        ("h=2,d_k=4,d_v=8", "OpenNMT-py needs h\\*d_k == h\\*d_v == d_model"),
        ("h=2,d_k=8,d_v=8,pe=learned", "pe='learned' is not available"),
        ("h=2,d_k=8,d_v=8,max_len=6000", "positional table has 5000 rows"),
    ],
)
def test_a_config_opennmt_cannot_build_is_a_one_line_error(overrides, message):
    with pytest.raises(SpecError, match=message) as info:
        load_model(f"opennmt,N=1,d_model=16,d_ff=32,vocab_size=50,{overrides}")
    assert "\n" not in str(info.value)


def test_positions_switch_off_and_back_on_when_nested(onmt):
    table, added = onmt.positional_table(5).clone(), lambda: onmt.decoder.embeddings.make_embedding.pe.pe[:5, 0]
    with onmt.positional_encoding(False):
        assert not added().any() and torch.equal(onmt.positional_table(5), table)
        with onmt.positional_encoding(True):
            assert torch.equal(added(), table)
        assert not added().any()
    assert torch.equal(added(), table)
