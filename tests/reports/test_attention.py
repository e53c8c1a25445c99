"""The attention figure: a small model's weights and BPE, laid out as the runner publishes them, drawn head by head.

The model is random-init (what is drawn must be the model's own attention, trained or not), saved as model.pt or as
the runner's checkpoint.pt; the BPE is trained on a few sentences into the runner's cache name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from ablations.data.bpe import EOS, shared_bpe
from ablations.data.corpora import Pairs
from ablations.studies import attention_data
from ablations.training.checkpoints import TrainState, save_checkpoint
from ablations.training.train import make_optimizer
from model import TransformerConfig, load_model
from reports import attention
from reports.inputs import MissingInput

EN = [
    "A boy wearing headphones sits on a woman's shoulders.",
    "A man sleeping in a green room on a couch.",
    "Two young men are playing soccer on a green field.",
    "A group of men are loading cotton onto a truck.",
    "A little girl climbs into a wooden playhouse.",
    "A woman wearing a hat sits on a bench.",
] * 3
DE = [
    "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
    "Ein Mann schläft in einem grünen Raum.",
    "Zwei junge Männer spielen Fußball auf einem grünen Feld.",
    "Eine Gruppe von Männern lädt Baumwolle.",
    "Ein kleines Mädchen klettert in ein Spielhaus.",
    "Eine Frau mit Hut sitzt auf einer Bank.",
] * 3
N, H = 3, 4


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    shared_bpe(Pairs(tuple(EN), tuple(DE)), 120, cache)
    return next(cache.glob("bpe-*.model"))


def publish(folder: Path, bpe: Path, weights: str = "model.pt", seed: int = 1) -> tuple[Path, torch.nn.Module]:
    """A base run folder as the publish step leaves it (config.json, final.json, weights) and the BPE beside it."""
    _, vocab, key = bpe.stem.split("-")
    cfg = TransformerConfig(N=N, d_model=16, d_ff=32, h=H, d_k=4, d_v=4, vocab_size=int(vocab))
    torch.manual_seed(seed)
    model = load_model("reference", config=cfg).eval()
    run = folder / "runs" / f"base-s{seed}-0000"
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps(
            {"row": "base", "seed": seed, "model_spec": "reference", "config": cfg.to_dict(), "data": {"bpe": key}}
        )
    )
    (run / "final.json").write_text(json.dumps({"status": "finished", "steps": 40}))
    if weights == "model.pt":
        torch.save(model.state_dict(), run / "model.pt")
    else:
        save_checkpoint(run / "checkpoint.pt", model, make_optimizer(model, torch.device("cpu")), TrainState(step=40))
    shutil.copy(bpe, folder / bpe.name)
    return run, model


def own_attention(model: torch.nn.Module, ids: list[int], layer: int) -> torch.Tensor:
    with torch.no_grad(), model.attention_probs() as records:
        model.encode(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.bool))
    return next(r.probs[0] for r in records if r.kind == "encoder_self" and r.layer == layer)


@pytest.mark.parametrize("weights", ["model.pt", "checkpoint.pt"])
def test_figure_shows_each_head_of_the_models_own_encoder_attention_in_layer_n_minus_1(tmp_path, bpe, weights):
    _, model = publish(tmp_path / "cpu", bpe, weights)
    fig = attention.draw(tmp_path / "cpu", tmp_path / "attention.png")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert [ax.get_title() for ax in panels] == [f"head {i + 1}" for i in range(H)]
    ids = spm.SentencePieceProcessor(model_file=str(bpe)).encode(attention.SENTENCE) + [EOS]
    expected = own_attention(model, ids, layer=N - 2)  # layer 2 of 3, as the paper draws layer 5 of 6
    for head, ax in enumerate(panels):
        drawn = torch.as_tensor(ax.images[0].get_array())
        torch.testing.assert_close(drawn, expected[head], rtol=0, atol=0)
        torch.testing.assert_close(drawn.sum(-1), torch.ones(len(ids)), rtol=0, atol=1e-6)  # rows: float32 softmax
    assert [t.get_text() for t in panels[0].get_xticklabels()][-1] == "<eos>" and len(panels[0].get_xticks()) == len(
        ids
    )
    assert "layer 2 of 3" in fig.texts[0].get_text() and (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG"


def test_published_attention_data_redraws_the_same_figure_without_weights_or_bpe(tmp_path, bpe):
    run, model = publish(tmp_path / "runs" / "cpu", bpe)
    results = tmp_path / "results" / "cpu"
    results.mkdir(parents=True)
    (results / attention.PUBLISHED).write_text(
        json.dumps(attention_data.extract(tmp_path / "runs" / "cpu", decimals=4))
    )
    fig = attention.draw(results, tmp_path / "attention.png")
    ids = spm.SentencePieceProcessor(model_file=str(bpe)).encode(attention.SENTENCE) + [EOS]
    expected = own_attention(model, ids, layer=N - 2)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert len(panels) == H and "layer 2 of 3" in fig.texts[0].get_text()
    for head, ax in enumerate(panels):  # the published data holds 4 decimals
        torch.testing.assert_close(torch.as_tensor(ax.images[0].get_array()), expected[head], rtol=0, atol=5e-5)


def test_the_lowest_seed_with_weights_is_drawn(tmp_path, bpe):
    publish(tmp_path / "cpu", bpe, seed=2)
    (tmp_path / "cpu" / bpe.name).unlink()
    run, _ = publish(tmp_path / "cpu", bpe, seed=1)
    assert attention_data.base_run(tmp_path / "cpu").directory == run


def test_a_run_with_a_damaged_config_is_passed_over_not_a_traceback(tmp_path, bpe):
    run, _ = publish(tmp_path / "cpu", bpe, seed=2)
    damaged = tmp_path / "cpu" / "runs" / "base-s1-0000"
    damaged.mkdir()
    (damaged / "config.json").write_text('{"row": "base", "se')  # a writer killed mid-file
    assert attention_data.base_run(tmp_path / "cpu").directory == run


def test_a_base_run_still_training_is_not_drawn(tmp_path, bpe):
    run, _ = publish(tmp_path / "cpu", bpe, weights="checkpoint.pt")
    (run / "final.json").unlink()  # training: a checkpoint, no final result yet
    with pytest.raises(MissingInput, match="no finished base run with weights"):
        attention.draw(tmp_path / "cpu", tmp_path / "attention.png")


def test_missing_bpe_model_is_one_line_naming_the_file(tmp_path, bpe):
    publish(tmp_path / "cpu", bpe)
    (tmp_path / "cpu" / bpe.name).unlink()
    with pytest.raises(MissingInput, match=f"no BPE model {bpe.name} in ") as missing:
        attention.draw(tmp_path / "cpu", tmp_path / "attention.png")
    assert "\n" not in str(missing.value)


def test_damaged_checkpoint_is_one_line_not_a_traceback(tmp_path, bpe):
    run, _ = publish(tmp_path / "cpu", bpe, weights="checkpoint.pt")
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(MissingInput, match="fails its checksum"):
        attention.draw(tmp_path / "cpu", tmp_path / "attention.png")
