"""A trained model's encoder self-attention for one sentence, as data: what the report draws like the paper's
Figures 3-5, and what `python -m ablations publish` saves beside a budget's results (the weights are not published).

The model is the finished base run with the lowest seed that kept its weights (ablations/training/trained.py rebuilds it);
the probabilities come from the model protocol's `attention_probs()`, so any model that offers that capability can
be drawn.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablations.data.bpe import EOS
from ablations.runs import folder as R
from ablations.training.trained import WEIGHTS, NoTrainedModel, TrainedModel, has_weights, load_trained
from plumbing.files import shown_path


class NoAttentionData(ValueError):
    """What the attention data needs is absent or damaged; the message is one line naming it."""


SENTENCE = "A boy wearing headphones sits on a woman's shoulders."  # Multi30k val, line 3 (the English source side)
MAX_HEADS = 8  # panels drawn; big has 16 heads
PUBLISHED = "attention.json"  # what `python -m ablations publish` saves beside the results


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


def base_run(folder: Path) -> R.Recorded:
    """The finished base run with weights and the lowest seed in a budget folder; NoAttentionData when there is none.
    A run whose config.json is damaged is not a base run."""
    found = []
    for run in map(R.recorded, R.run_folders(folder)):
        if (run.config or {}).get("row") == "base" and run.status == "finished" and has_weights(run.directory):
            found.append((run.config.get("seed", 0), run.directory, run))
    if not found:
        raise NoAttentionData(f"no finished base run with weights ({' or '.join(WEIGHTS)}) under {shown_path(folder)}")
    return min(found, key=lambda item: item[:2])[2]


def extract(folder: Path, sentence: str = SENTENCE, decimals: int | None = None) -> dict:
    """What the figure shows, as data, from the trained base model of a runner's budget folder: the sentence's
    tokens and the encoder self-attention of layer N-1 (published rounded to 4 decimals, enough to draw: the
    weights are not published, these few kilobytes are)."""
    run = base_run(folder)
    try:
        trained = load_trained(run, [folder, folder.parent / "cache"])
    except NoTrainedModel as exc:
        raise NoAttentionData(str(exc)) from None
    layer = default_layer(trained.model.config.N)
    tokens, probs = encoder_attention(trained, sentence, layer)
    return {
        "run": run.directory.name,
        "label": trained.label,
        "layer": layer,
        "layers": trained.model.config.N,
        "sentence": sentence,
        "tokens": tokens,
        "probs": (probs[:MAX_HEADS] if decimals is None else probs[:MAX_HEADS].round(decimals=decimals)).tolist(),
    }
