"""A trained model's encoder self-attention for one sentence, as data: what the report draws like the paper's
Figures 3-5, and what `python -m ablations publish` saves beside a budget's results (the weights are not published).

A run folder gives the model: config.json ("config" holds the TransformerConfig, "model_spec" names the model, "data"
the BPE's key) and its weights, `model.pt` (a state_dict) or else the runner's `checkpoint.pt`. The BPE model
(sentencepiece) is found by the name the runner's cache gives it, `bpe-<vocab>-<key>.model`, in the run folder, the
budget folder, or the runner's `cache/` beside the budget folder. The probabilities come from the model protocol's
`attention_probs()`, so any model that offers that capability can be drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch

from ablations.bpe import EOS
from ablations.runs import read_json, shown_path
from ablations.train import CorruptCheckpoint, read_checkpoint
from model import Seq2SeqModel, SpecError, TransformerConfig, load_model, parse_spec


class NoAttentionData(ValueError):
    """What the attention data needs is absent or damaged; the message is one line naming it."""


SENTENCE = "A boy wearing headphones sits on a woman's shoulders."  # Multi30k val, line 3 (the English source side)
WEIGHTS = ("model.pt", "checkpoint.pt")  # a state_dict, or the runner's checkpoint (header line, then torch.save bytes)
MAX_HEADS = 8  # panels drawn; big has 16 heads
PUBLISHED = "attention.json"  # what `python -m ablations publish` saves beside the results


@dataclass(frozen=True)
class TrainedModel:
    """A model rebuilt from a run folder, its BPE, and what the figure's title says about it."""

    model: Seq2SeqModel
    sp: spm.SentencePieceProcessor
    label: str  # e.g. "base seed 1, 3000 steps"
    config: dict  # the run's config.json


def bpe_file(config: dict) -> str:
    """The BPE model's file name in the runner's cache (ablations.bpe.shared_bpe): bpe-<vocab>-<key>.model."""
    return f"bpe-{config['config']['vocab_size']}-{config['data']['bpe']}.model"


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model's state_dict from model.pt, else from checkpoint.pt; NoAttentionData when neither is there and whole."""
    if (run_dir / "model.pt").is_file():
        return torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    if (run_dir / "checkpoint.pt").is_file():
        try:
            return read_checkpoint(run_dir / "checkpoint.pt")["model"]
        except CorruptCheckpoint as exc:
            raise NoAttentionData(f"{shown_path(run_dir / 'checkpoint.pt')}: {exc}") from None
    raise NoAttentionData(f"no model weights ({' or '.join(WEIGHTS)}) in {shown_path(run_dir)}")


def run_config(run_dir: Path) -> dict:
    """The run's config.json, with what rebuilding its model needs; NoAttentionData naming the file when it is absent,
    damaged or lacks a field."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise NoAttentionData(f"{shown_path(run_dir)}: no config.json; pass a run folder, e.g. runs/cpu/base-s1-<hash>")
    config = read_json(path)
    if config is None:
        raise NoAttentionData(f"{shown_path(path)} is not a JSON object (damaged?); pass a run folder the runner wrote")
    missing = [k for k in ("row", "seed", "config") if k not in config]
    if not isinstance(config.get("data"), dict) or "bpe" not in config["data"]:
        missing.append("data.bpe")
    if missing:
        raise NoAttentionData(f"{shown_path(path)} lacks {', '.join(missing)}: not a config.json the runner wrote")
    return config


def load_trained(run_dir: Path, bpe_dirs: list[Path]) -> TrainedModel:
    """Rebuild the run's model with its weights (eval mode, CPU) and load its BPE; NoAttentionData names what is absent."""
    config = run_config(run_dir)
    name = bpe_file(config)
    bpe = next((d / name for d in [run_dir, *bpe_dirs] if (d / name).is_file()), None)
    if bpe is None:
        raise NoAttentionData(f"no BPE model {name} in {shown_path(run_dir)} or {', '.join(shown_path(d) for d in bpe_dirs)}")
    weights = _weights(run_dir)
    try:
        model = load_model(parse_spec(config.get("model_spec") or "reference").with_config(TransformerConfig(**config["config"])))
        model.load_state_dict(weights)
    except (SpecError, RuntimeError, TypeError, ValueError) as exc:  # a bad spec or config, weights of another shape
        raise NoAttentionData(f"the weights in {shown_path(run_dir)} do not load into its model ({str(exc).splitlines()[0]})") from None
    final = run_dir / "final.json"
    steps = (read_json(final) or {}).get("steps")
    label = f"{config['row']} seed {config['seed']}" + (f", {steps} steps" if steps else "")
    return TrainedModel(model.eval(), spm.SentencePieceProcessor(model_file=str(bpe)), label, config)


def encoder_attention(trained: TrainedModel, sentence: str, layer: int) -> tuple[list[str], torch.Tensor]:
    """The sentence's BPE pieces (with the end-of-sentence token the encoder sees) and the encoder self-attention
    probabilities of `layer` (0-based), (h, S, S): row i is query token i's distribution over the tokens."""
    ids = trained.sp.encode(sentence) + [EOS]
    src = torch.tensor([ids])
    with torch.no_grad(), trained.model.attention_probs() as records:
        trained.model.encode(src, torch.zeros_like(src, dtype=torch.bool))
    probs = [r.probs for r in records if r.kind == "encoder_self" and r.layer == layer]
    if not probs:
        raise NoAttentionData(f"the model recorded no encoder self-attention for layer {layer}")
    return [trained.sp.id_to_piece(i) for i in ids[:-1]] + ["<eos>"], probs[0][0].float()


def default_layer(n_layers: int) -> int:
    """Layer 5 of 6, as in the paper's Figures 3-5: the one before the last (0-based N-2), the only one when N=1."""
    return max(n_layers - 2, 0)


def finished(run_dir: Path) -> bool:
    """Whether the run's final.json says it finished (a run still training has a checkpoint but no final result)."""
    return (read_json(run_dir / "final.json") or {}).get("status") == "finished"


def base_run(folder: Path) -> Path:
    """The finished base run with weights and the lowest seed in a budget folder; NoAttentionData when there is none."""
    found = []
    for config_path in folder.rglob("config.json"):
        config, run_dir = read_json(config_path) or {}, config_path.parent  # a damaged config.json is not a base run
        if config.get("row") == "base" and finished(run_dir) and any((run_dir / w).is_file() for w in WEIGHTS):
            found.append((config.get("seed", 0), run_dir))
    if not found:
        raise NoAttentionData(f"no finished base run with weights ({' or '.join(WEIGHTS)}) under {shown_path(folder)}")
    return min(found)[1]


def extract(folder: Path, sentence: str = SENTENCE, decimals: int | None = None) -> dict:
    """What the figure shows, as data, from the trained base model of a runner's budget folder: the sentence's
    tokens and the encoder self-attention of layer N-1 (published rounded to 4 decimals, enough to draw: the
    weights are not published, these few kilobytes are)."""
    run_dir = base_run(folder)
    trained = load_trained(run_dir, [folder, folder.parent / "cache"])
    layer = default_layer(trained.model.config.N)
    tokens, probs = encoder_attention(trained, sentence, layer)
    return {"run": run_dir.name, "label": trained.label, "layer": layer, "layers": trained.model.config.N,
            "sentence": sentence, "tokens": tokens, "probs": (probs[:MAX_HEADS] if decimals is None else probs[:MAX_HEADS].round(decimals=decimals)).tolist()}
