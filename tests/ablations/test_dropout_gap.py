"""`python -m ablations.studies.dropout_gap` scores a run's weights with dropout off (as the runner does) and on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ablations.data.corpora import data_dir
from ablations.grid.runner import prepare_data
from ablations.runs.budgets import budget
from ablations.scoring.evaluate import perplexity
from ablations.studies import dropout_gap
from model import TransformerConfig, load_model
from tests.helpers import needs_data


def smoke_run(runs: Path) -> tuple[Path, torch.nn.Module, list, list]:
    """A random-init run folder of the smoke budget as the runner leaves it, with model.pt, and its dev set."""
    data = prepare_data(budget("smoke"), "multi30k", data_dir(), runs)
    cfg = TransformerConfig(
        N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=budget("smoke").vocab_size, P_drop=0.3
    )
    torch.manual_seed(0)
    model = load_model("reference", config=cfg)
    run = runs / "smoke" / "base-s1-0000"
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps(
            {
                "row": "base",
                "seed": 1,
                "budget": "smoke",
                "preset": "multi30k",
                "model_spec": "reference",
                "config": cfg.to_dict(),
                "data": {"bpe": data.bpe_key},
            }
        )
    )
    torch.save(model.state_dict(), run / "model.pt")
    return run, model, data.dev_src, data.dev_tgt


@needs_data
def test_dropout_off_is_the_dev_ppl_runs_report_and_dropout_on_differs(tmp_path, capsys):
    run, model, src, tgt = smoke_run(tmp_path / "runs")
    assert dropout_gap.main([str(run), "--pairs", "20"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    label, off, on = (cell.strip() for cell in row.strip("|").split("|"))
    scored = perplexity(model, src[:20], tgt[:20], torch.device("cpu"))
    assert label == "base seed 1" and float(off.replace(",", "")) == round(scored, 1)
    assert float(on.replace(",", "")) != float(off.replace(",", ""))


@needs_data
def test_more_pairs_than_the_budgets_dev_set_scores_that_dev_set(tmp_path, capsys):
    run, model, src, tgt = smoke_run(tmp_path / "runs")  # the smoke budget scores its first 100 dev pairs
    assert dropout_gap.main([str(run), "--pairs", str(len(src) + 50)]) == 0
    off = capsys.readouterr().out.strip().splitlines()[-1].strip("|").split("|")[1]
    assert float(off.replace(",", "")) == round(perplexity(model, src, tgt, torch.device("cpu")), 1)


@needs_data
def test_the_dev_set_size_the_run_recorded_caps_the_pairs_scored(tmp_path, capsys):
    run, model, src, tgt = smoke_run(tmp_path / "runs")
    config = json.loads((run / "config.json").read_text())
    config["data"]["dev_pairs"] = 30  # as `run --dev-pairs 30` records it
    (run / "config.json").write_text(json.dumps(config))
    assert dropout_gap.main([str(run)]) == 0
    off = capsys.readouterr().out.strip().splitlines()[-1].strip("|").split("|")[1]
    assert float(off.replace(",", "")) == round(perplexity(model, src[:30], tgt[:30], torch.device("cpu")), 1)


def test_a_folder_that_is_not_a_run_is_a_one_line_error(tmp_path, capsys):
    assert dropout_gap.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: no config.json; pass a run folder")


@pytest.mark.parametrize(
    "text, problem",
    [("{bad", "is not a JSON object (damaged?)"), ('{"row": "base", "seed": 1}', "lacks config, data.bpe")],
)
def test_a_damaged_or_foreign_config_is_a_one_line_error_naming_the_file(tmp_path, capsys, text, problem):
    (tmp_path / "config.json").write_text(text)
    assert dropout_gap.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'config.json'} {problem}") and err.count("\n") == 1


def layer_rows(table: str) -> dict[str, list[str]]:
    """The --layers table as {sublayer: [ratio off, ratio on, cosine]}."""
    cells = [line.strip("|").split("|") for line in table.splitlines()[2:]]
    return {c[0].strip(): [x.strip() for x in c[1:]] for c in cells}


def tiny_pairs() -> tuple[list[list[int]], list[list[int]]]:
    generator = torch.Generator().manual_seed(0)
    src = [torch.randint(4, 40, (n,), generator=generator).tolist() + [3] for n in (5, 9, 7)]
    return src, [torch.randint(4, 40, (n,), generator=generator).tolist() for n in (6, 4, 8)]


@pytest.mark.parametrize("p_drop", [0.0, 0.3])
def test_layers_part_between_the_modes_only_where_dropout_acts(p_drop):
    cfg = TransformerConfig(N=2, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=40, P_drop=p_drop)
    torch.manual_seed(0)
    table = dropout_gap.layer_table(load_model("reference", config=cfg), *tiny_pairs())
    rows = layer_rows(table)
    sublayers = [name for name in rows if name.startswith(("encoder", "decoder"))]
    assert sublayers == [f"encoder.{i}.{s}" for i in range(2) for s in ("res_attn", "res_ffn")] + [
        f"decoder.{i}.{s}" for i in range(2) for s in ("res_self", "res_cross", "res_ffn")
    ]
    cosines = [float(rows[name][2]) for name in sublayers]
    if p_drop == 0.0:  # the modes differ only by dropout: without it, the same outputs
        assert all(c == 1.0 for c in cosines) and all(rows[n][0] == rows[n][1] for n in sublayers)
    else:
        assert all(c < 0.999 for c in cosines)


def test_layers_of_a_model_without_the_references_sublayers_is_a_one_line_reason():
    cfg = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=40)
    with pytest.raises(ValueError, match="--layers reads the reference model's residual sublayers"):
        dropout_gap.layer_table(load_model("torch-nn", config=cfg), *tiny_pairs())


@needs_data
def test_layers_prints_each_runs_sublayer_table_after_its_perplexities(tmp_path, capsys):
    run, _, _, _ = smoke_run(tmp_path / "runs")
    assert dropout_gap.main([str(run), "--pairs", "20", "--layers"]) == 0
    out = capsys.readouterr().out
    assert "| encoder.0.res_attn |" in out and "| predicted distribution: entropy (nats) |" in out
