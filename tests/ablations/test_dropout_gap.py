"""`python -m ablations.dropout_gap` scores a run's weights with dropout off (as the runner does) and on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ablations import dropout_gap
from ablations.budgets import budget
from ablations.data import data_dir
from ablations.evaluate import perplexity
from ablations.grid import prepare_data
from model import ModelSpec, TransformerConfig, load_model
from tests.helpers import needs_data


def smoke_run(runs: Path) -> tuple[Path, torch.nn.Module, list, list]:
    """A random-init run folder of the smoke budget as the runner leaves it, with model.pt, and its dev set."""
    data = prepare_data(budget("smoke"), "multi30k", data_dir(), runs)
    cfg = TransformerConfig(
        N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=budget("smoke").vocab_size, P_drop=0.3
    )
    torch.manual_seed(0)
    model = load_model(ModelSpec("reference").with_config(cfg))
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
