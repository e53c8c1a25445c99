"""The paper as an oracle (invariants/properties/oracle.py): a model's own weights in the paper's layout, through the reference,
compared output by output and sub-layer by sub-layer. Tiny configs and few cases: a few seconds in all."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from invariants.engine import ERROR, FAIL, NOT_APPLICABLE, PASS
from invariants.properties.oracle import (
    reference_for,
    table3_cases,
    NO_LAYOUT,
    NO_SUBLAYERS,
    OracleCase,
    localise,
    oracle_cached_decoding,
    oracle_decoder,
    oracle_encoder,
    oracle_logits,
    prepared,
)
from invariants.subject import Subject
from model.table3 import table3_rows
from model.paper_params import Positions, export_paper_params, leaves, sites
from model.registry import load_model
from model.transformer import Transformer
from tests.helpers import few

TINY = "N=2,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=30,max_len=16"
CHECKS = (oracle_encoder, oracle_decoder, oracle_logits, oracle_cached_decoding)


def departing_sites(spec: str, padding: str = "right") -> set[str]:
    """The sub-layers that depart from the paper on one batch, without their layer number."""
    model, oracle, batch = prepared(Subject(spec), OracleCase({}, 2, 6, 5, padding, 1))
    with torch.no_grad():
        return {d.site.split(".")[0] + "." + d.site.split(".", 2)[-1] for d in localise(model, oracle, batch)}


def test_the_reference_exports_and_loads_the_papers_layout_exactly():
    model = load_model(f"reference,{TINY}").double()
    params = export_paper_params(model)
    again = export_paper_params(reference_for(params, model.config))
    for (path, a), (_, b) in zip(leaves(params), leaves(again)):
        assert (a is None and b is None) or torch.equal(a, b), path
    assert params.shared() and not params.missing() and not params.extras
    assert params.encoder[0].self_attention.W_Q.shape == (2, 16, 8)  # W^Q_i: d_model x d_k for each of h heads


def test_the_reference_agrees_with_the_paper_on_every_equivalence_check():
    subject = Subject(f"reference,{TINY}")
    results = [check(subject, settings=few(3)) for check in CHECKS]
    assert [r.verdict for r in results] == [PASS] * 4, [r.reason for r in results]
    assert all(r.worst_error <= 1e-12 for r in results)


def test_the_reference_exposes_every_sublayer_the_paper_names():
    model = load_model(f"reference,{TINY}").double().eval()
    src, tgt = torch.randint(1, 30, (1, 3)), torch.randint(1, 30, (1, 2))
    recorded = model.paper_sublayers(src, tgt, src == 0, tgt == 0)
    assert list(sites(2)) == [s for s in sites(2) if s in recorded] and len(recorded) == len(sites(2))


def test_torch_nn_departs_only_at_its_final_layer_norms():
    assert departing_sites(f"torch-nn,{TINY}", "left") == {"encoder.output", "decoder.output"}
    result = oracle_encoder(Subject(f"torch-nn,{TINY}"), settings=few(1))
    assert result.verdict == FAIL and "first departs at encoder.output" in result.reason
    assert "core.encoder.norm.weight" in result.reason  # listed as a parameter beyond the paper
    assert oracle_cached_decoding(Subject(f"torch-nn,{TINY}"), settings=few(1)).verdict == NOT_APPLICABLE


@pytest.mark.parametrize(
    "mutant, first",
    [
        ("no_attention_scaling", "encoder.0.self_attention ("),  # eq. (1) without 1/sqrt(d_k)
        ("cross_attention_unscaled", "decoder.0.cross_attention ("),
        ("pe_concatenated", "encoder.embedded ("),  # section 3.5's sinusoids in the wrong layout
        ("ffn_gelu", "encoder.0.ffn ("),  # eq. (2)'s ReLU replaced
        ("pre_ln_blocks", "encoder.0.self_attention.input ("),  # LayerNorm before the sub-layer, not after the sum
        ("cross_attention_reads_decoder", "decoder.0.cross_attention.memory ("),
        ("values_from_key_projection", "encoder.0.self_attention ("),  # V = K W^K_i in eq. (1)
        ("rms_norm", "encoder.0.norm_1 ("),  # no centring, no bias: not section 3.1's LayerNorm
        ("logits_scaled_like_embeddings", "logits ("),  # section 3.4's sqrt(d_model) on the pre-softmax linear
    ],
)
def test_a_mutant_that_changes_the_eval_function_is_caught_and_localised_to_its_sublayer(mutant, first):
    result = oracle_logits(Subject(f"mutant:{mutant},{TINY}"), settings=few(1))
    assert result.verdict == FAIL and result.worst_error > 1e-3
    assert f"first departs at {first}" in result.reason, result.reason


def test_a_missing_layer_norm_is_reported_as_a_finding_and_localised():
    result = oracle_encoder(Subject(f"mutant:no_layer_norm,{TINY}"), settings=few(1))
    assert result.verdict == FAIL and "lacks the paper's encoder.0.norm_1.gain" in result.reason
    assert "first departs at encoder.0.norm_1 (section 3.1" in result.reason


class WithoutLayout(Transformer):
    def paper_params(self):
        raise NotImplementedError("weights kept private")


class WithoutSublayers(Transformer):
    def paper_sublayers(self, src, tgt, src_pad, tgt_pad):
        raise NotImplementedError


def no_scaling(config):
    from invariants.mutants import MUTANTS
    from model.transformer import Parts

    model = WithoutSublayers(config, Parts(**MUTANTS["no_attention_scaling"].parts))
    return model


def test_without_the_layout_the_checks_are_not_applicable_and_without_sublayers_the_verdict_stands():
    result = oracle_encoder(Subject(lambda cfg: WithoutLayout(cfg.replace(**_tiny()))), settings=few(1))
    assert result.verdict == NOT_APPLICABLE and NO_LAYOUT in result.reason
    result = oracle_encoder(Subject(lambda cfg: no_scaling(cfg.replace(**_tiny()))), settings=few(1))
    assert result.verdict == FAIL and NO_SUBLAYERS in result.reason


class SinusoidsLeftOut(Transformer):
    """A correct model whose layout names its positions 'sinusoidal' without handing over its float32 table."""

    def paper_params(self):
        params = super().paper_params()
        kind = params.positions.kind  # learned at Table 3's row E
        return replace(params, positions=Positions(kind)) if kind == "sinusoidal" else params


def test_sinusoids_left_out_of_the_layout_are_read_from_the_model_so_a_float32_table_is_no_departure():
    subject = Subject(lambda cfg: SinusoidsLeftOut(cfg.replace(**_tiny())))
    for check in CHECKS:
        result = check(subject, settings=few(1))
        assert result.verdict == PASS, (check.name, result.reason)


def test_a_layout_of_the_wrong_shape_is_an_error_not_a_catch():
    class Transposed(Transformer):
        def paper_params(self):
            from dataclasses import replace

            params = export_paper_params(self)
            return replace(params, pre_softmax=params.pre_softmax.T)

    result = oracle_logits(Subject(lambda cfg: Transposed(cfg.replace(**_tiny()))), settings=few(1))
    assert result.verdict == ERROR and "pre_softmax has shape" in result.reason


def _tiny() -> dict[str, object]:
    return {k: int(v) for k, v in (pair.split("=") for pair in TINY.split(","))}


def test_marian_departs_only_at_its_concatenated_sinusoids_and_bart_only_at_its_embedding_layer_norm():
    pytest.importorskip("transformers")
    assert departing_sites(f"hf-marian,{TINY}", "left") == {"encoder.embedded", "decoder.embedded"}
    assert departing_sites(f"hf-bart,{TINY}", "none") == {"encoder.embedded", "decoder.embedded"}
    bart = oracle_cached_decoding(Subject(f"hf-bart,{TINY}"), settings=few(1))
    assert bart.verdict == FAIL and "layernorm_embedding" in bart.reason and "row E" in bart.reason
    marian = oracle_decoder(Subject(f"hf-marian,{TINY}"), settings=few(1))
    assert marian.verdict == FAIL and "departs from section 3.5's sinusoids" in marian.reason


def test_the_oracle_checks_each_table3_row_the_model_can_be_built_at_and_skips_those_it_refuses():
    reference = table3_cases(Subject("reference"))
    torch_nn = table3_cases(Subject("torch-nn"))
    assert [c.row for c in reference] == [row.name for row in table3_rows()]  # all 20, learned PE (E1) included
    assert {"B1", "B2"}.isdisjoint(c.row for c in torch_nn) and len(torch_nn) == 18  # h d_k != d_model: refused
    b1 = next(c for c in reference if c.row == "B1")
    assert b1.config["h"] * b1.config["d_k"] != b1.config["d_model"]  # row B's ratio kept at 1/16 of its sizes
