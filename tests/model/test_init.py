"""The init rule: what each rule draws, that every shipped implementation draws by it, how a budget sets it per row,
and the cross-check command that trains several implementations on the same batches."""

import math
import shutil

import pandas as pd
import pytest
import torch

from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS, row_config
from ablations.studies import compare
from model import load_model
from model.config import TransformerConfig
from model.init import NORMAL_STD
from model.table3 import table3_rows
from tests.helpers import REAL_DATA, needs_data, smoke_cache

SMALL = "N=2,d_model=64,d_ff=256,h=8,d_k=8,d_v=8,vocab_size=4000"
ROWS = {r.name: r for r in table3_rows()}


def stds(spec: str) -> tuple[float, float]:
    """(std of the token embeddings, std of the first encoder FFN matrix) of the model the spec builds."""
    torch.manual_seed(0)
    model = load_model(f"{spec},{SMALL}")
    ffn = next(p for name, p in model.named_parameters() if p.dim() == 2 and p.shape == (256, 64))
    return model.embedding_weights()["source"].std().item(), ffn.std().item()


def test_xavier_at_a_wider_init_width_shrinks_every_std_by_the_root_of_the_width_ratio():
    own_embedding, own_ffn = stds("reference")
    wide_embedding, wide_ffn = stds("reference,init_width=512")
    assert wide_embedding == pytest.approx(own_embedding / math.sqrt(8), rel=0.02)
    assert wide_ffn == pytest.approx(own_ffn / math.sqrt(8), rel=0.02)
    assert own_embedding == pytest.approx(64**-0.5, rel=0.02)
    assert own_ffn == pytest.approx(math.sqrt(2 / (64 + 256)), rel=0.02)


@pytest.mark.parametrize("spec", ["reference", "torch-nn", "hf-marian", "hf-bart"])
def test_every_shipped_implementation_draws_its_matrices_and_embeddings_by_the_config_rule(spec):
    embedding, ffn = stds(f"{spec},init=normal")
    assert embedding == pytest.approx(NORMAL_STD, rel=0.03)
    assert ffn == pytest.approx(NORMAL_STD, rel=0.03)
    embedding, ffn = stds(f"{spec},init_width=512")
    assert embedding == pytest.approx(512**-0.5, rel=0.03)
    assert ffn == pytest.approx(math.sqrt(2 / (512 + 2048)), rel=0.03)


def test_the_tied_pre_softmax_weight_is_drawn_as_the_embedding_it_is():
    torch.manual_seed(0)
    model = load_model(f"hf-marian,{SMALL}")
    weights = model.embedding_weights()
    assert weights["generator"].data_ptr() == weights["source"].data_ptr()
    assert weights["source"].std().item() == pytest.approx(64**-0.5, rel=0.02)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"init": "kaiming"}, "init='kaiming' must be one of xavier, normal"),
        ({"init_width": -1}, "init_width=-1 must be 0"),
        ({"init": "normal", "init_width": 512}, "applies to init='xavier' only"),
    ],
)
def test_a_bad_init_field_is_a_one_line_error_naming_it(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TransformerConfig(**changes)


@pytest.mark.parametrize("row, width", [("base", 512), ("C4", 256), ("C5", 1024), ("big", 1024)])
def test_the_paper_width_rule_starts_each_scaled_row_as_its_paper_size_counterpart(row, width):
    cfg = row_config(ROWS[row], BUDGETS["cpu"].replace(init="paper-width"), vocab_size=2000)
    assert (cfg.d_model, cfg.init, cfg.init_width) == (width // 8, "xavier", width)


def test_a_budget_at_the_papers_sizes_keeps_the_models_own_width():
    cfg = row_config(ROWS["base"], BUDGETS["short"].replace(init="paper-width"), vocab_size=2000)
    assert (cfg.init, cfg.init_width) == ("xavier", 0)


def test_an_unknown_init_rule_is_refused_by_the_budget():
    with pytest.raises(ValueError, match="init rule 'he'"):
        BUDGETS["cpu"].replace(init="he")


def test_a_compare_entry_is_a_spec_and_an_init_rule():
    entry = compare.parse_entry("hf-marian@normal", "xavier")
    assert (str(entry.spec), entry.init, entry.label) == ("hf-marian", "normal", "hf-marian@normal")
    assert compare.parse_entry("torch-nn", "paper-width").init == "paper-width"
    with pytest.raises(ValueError, match="init rule 'he'"):
        compare.parse_entry("reference@he", "xavier")


def test_the_compare_figure_has_one_panel_per_row_four_to_a_line(tmp_path, monkeypatch):
    found = pd.DataFrame(
        [
            {"model": m, "row": r, "seed": 1, "step": s, "dev_ppl": 300 / s**0.5}
            for m in ("a", "b")
            for r in ("base", "A1", "B1", "C1", "C3")
            for s in (250, 500)
        ]
    )
    drawn = []
    monkeypatch.setattr(compare.plt, "close", drawn.append)
    compare.figure(found, tmp_path / "f.png", "five rows")
    panels = drawn[0].axes
    assert [ax.get_title() for ax in panels if ax.get_visible()] == ["row base", "row A1", "row B1", "row C1", "row C3"]
    assert len(panels) == 8 and {ax.get_subplotspec().get_geometry()[:2] for ax in panels} == {(2, 4)}
    assert (tmp_path / "f.png").stat().st_size > 0


@pytest.mark.slow
@needs_data
def test_compare_trains_each_entry_on_the_same_batches_and_draws_one_curve_per_entry(tmp_path_factory, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(smoke_cache(tmp_path_factory), runs / "cache")
    out = tmp_path / "report" / "smoke"
    argv = [
        "--budget",
        "smoke",
        "--rows",
        "C1",
        "--steps",
        "12",
        "--dev-pairs",
        "5",
        "--runs",
        str(runs),
        "--out",
        str(out),
        "--data",
        str(REAL_DATA),
        "--models",
        "reference@xavier",
        "reference@normal",
    ]
    assert compare.main(argv) == 0
    found = pd.read_csv(out.with_suffix(".csv"))
    assert set(found["model"]) == {"reference@xavier", "reference@normal"}
    assert found["run"].nunique() == 2 and set(found["status"]) == {"finished"}
    assert out.with_suffix(".png").stat().st_size > 0
    assert "reference@normal" in out.with_suffix(".md").read_text()
    assert "Mean over rows of the last dev PPL and the BLEU" in out.with_suffix(".md").read_text()
    assert compare.main([*argv, "--report-only"]) == 0  # redrawn from disk, nothing trained again
    trained_at = R.read_final(runs / "smoke" / found["run"].iloc[0])["commit"]
    assert f"commit {trained_at}" in out.with_suffix(".md").read_text()  # the runs' commit, not only the drawing's


def test_a_schedule_is_a_peak_and_a_warmup_and_anything_else_is_refused():
    assert compare.parse_schedule("1e-3/500") == compare.Schedule(1e-3, 500)
    for bad in ("1e-3", "fast/500", "2/500", "1e-3/0"):
        with pytest.raises(ValueError, match="give PEAK/WARMUP"):
            compare.parse_schedule(bad)


def test_torch_nn_draws_each_block_of_its_fused_query_key_value_weight_as_the_square_map_it_is():
    torch.manual_seed(0)
    model = load_model(f"torch-nn,{SMALL}")
    fused = model.core.encoder.layers[0].self_attn.in_proj_weight
    for block in fused.detach().view(3, 64, 64):
        assert block.std().item() == pytest.approx(math.sqrt(2 / (64 + 64)), rel=0.05)
