"""Attention maps like the paper's Figures 3-5: a trained model's encoder self-attention in one layer for one sentence,
one panel per head, drawn from a budget's published attention.json or, in a runner's folder, from the trained base
model itself (ablations/studies/attention_data.py reads both).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ablations.studies.attention_data import MAX_HEADS, PUBLISHED, SENTENCE, NoAttentionData, extract  # noqa: E402
from reports.inputs import MissingInput  # noqa: E402


def attention_figure(tokens: list[str], probs: torch.Tensor, path: Path, title: str) -> plt.Figure:
    """One heatmap per head (at most MAX_HEADS), shared axes and colour scale 0-1: query tokens down, keys across."""
    heads = min(probs.shape[0], MAX_HEADS)
    cols = min(heads, 4)
    rows = (heads + cols - 1) // cols
    size = 0.16 * len(tokens) + 1.0
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(size * cols + 1.0, size * rows + 0.8),
        sharex=True,
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.set_visible(False)
            continue
        image = ax.imshow(probs[head].numpy(), vmin=0.0, vmax=1.0, cmap="Blues")
        ax.set_title(f"head {head + 1}", fontsize=8)
        ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
        ax.grid(False)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention probability")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return fig


def draw(folder: Path, path: Path, sentence: str = SENTENCE) -> plt.Figure:
    """The attention figure of a budget folder: from its published attention.json, else from a trained base
    model's weights in it (a runner's folder); MissingInput (one line) when neither is there."""
    saved = folder / PUBLISHED
    try:
        doc = json.loads(saved.read_text()) if saved.is_file() else extract(folder, sentence)
    except NoAttentionData as exc:
        raise MissingInput(str(exc)) from None
    title = (
        f"Encoder self-attention, layer {doc['layer'] + 1} of {doc['layers']}, {doc['label']} "
        f"(budget {folder.name}); rows: query token, columns: attended token"
    )
    return attention_figure(doc["tokens"], torch.tensor(doc["probs"]), path, title)
