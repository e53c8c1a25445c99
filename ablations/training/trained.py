"""A trained model rebuilt from its run folder: the model its config.json names, its weights, and its BPE.

What the attention figure draws and `python -m ablations.studies.dropout_gap` scores. The weights are the run's model.pt
(a state_dict) or else the runner's checkpoint.pt; the BPE model (sentencepiece) is found by its cache name in the run
folder or in the folders given (the budget folder, the runner's cache/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch

from ablations.data.bpe import bpe_file
from ablations.runs import folder as R
from ablations.training.checkpoints import CorruptCheckpoint, read_checkpoint
from model import Seq2SeqModel, SpecError, TransformerConfig, load_model
from plumbing.files import shown_path

WEIGHTS = (R.WEIGHTS, R.CHECKPOINT)  # where a run's weights are looked for, in this order


class NoTrainedModel(ValueError):
    """What rebuilding the model needs is absent or damaged; the message is one line naming it."""


@dataclass(frozen=True)
class TrainedModel:
    """A model rebuilt from a run folder, its BPE, and what a figure's title says about it."""

    model: Seq2SeqModel
    sp: spm.SentencePieceProcessor
    label: str  # e.g. "base seed 1, 3000 steps"
    config: dict  # the run's config.json


def has_weights(run_dir: Path) -> bool:
    return any((run_dir / name).is_file() for name in WEIGHTS)


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model's state_dict from model.pt, else from checkpoint.pt; NoTrainedModel when neither is there and whole."""
    if (run_dir / R.WEIGHTS).is_file():
        return torch.load(run_dir / R.WEIGHTS, map_location="cpu", weights_only=True)
    if (run_dir / R.CHECKPOINT).is_file():
        try:
            return read_checkpoint(run_dir / R.CHECKPOINT)["model"]
        except CorruptCheckpoint as exc:
            raise NoTrainedModel(f"{shown_path(run_dir / R.CHECKPOINT)}: {exc}") from None
    raise NoTrainedModel(f"no model weights ({' or '.join(WEIGHTS)}) in {shown_path(run_dir)}")


def _config(run: R.Recorded) -> dict:
    """The run's config.json, holding what rebuilding its model needs; NoTrainedModel naming the file when it is absent,
    damaged or lacks a field."""
    path = run.directory / R.CONFIG
    if not path.is_file():
        raise NoTrainedModel(
            f"{shown_path(run.directory)}: no {R.CONFIG}; pass a run folder, e.g. runs/cpu/base-s1-<hash>"
        )
    if run.config is None:
        raise NoTrainedModel(f"{shown_path(path)} is not a JSON object (damaged?); pass a run folder the runner wrote")
    missing = [k for k in ("row", "seed", "config") if k not in run.config]
    if not isinstance(run.config.get("data"), dict) or "bpe" not in run.config["data"]:
        missing.append("data.bpe")
    if missing:
        raise NoTrainedModel(f"{shown_path(path)} lacks {', '.join(missing)}: not a {R.CONFIG} the runner wrote")
    return run.config


def load_trained(run: R.Recorded, bpe_dirs: list[Path]) -> TrainedModel:
    """Rebuild the run's model with its weights (eval mode, CPU) and load its BPE; NoTrainedModel names what is absent."""
    config, run_dir = _config(run), run.directory
    name = bpe_file(config["config"]["vocab_size"], config["data"]["bpe"])
    bpe = next((d / name for d in [run_dir, *bpe_dirs] if (d / name).is_file()), None)
    if bpe is None:
        raise NoTrainedModel(
            f"no BPE model {name} in {shown_path(run_dir)} or {', '.join(shown_path(d) for d in bpe_dirs)}"
        )
    weights = _weights(run_dir)
    try:
        model = load_model(config.get("model_spec") or "reference", config=TransformerConfig(**config["config"]))
        model.load_state_dict(weights)
    except (SpecError, RuntimeError, TypeError, ValueError) as exc:  # a bad spec or config, weights of another shape
        raise NoTrainedModel(
            f"the weights in {shown_path(run_dir)} do not load into its model ({str(exc).splitlines()[0]})"
        ) from None
    steps = (run.final or {}).get("steps")
    label = f"{config['row']} seed {config['seed']}" + (f", {steps} steps" if steps else "")
    return TrainedModel(model.eval(), spm.SentencePieceProcessor(model_file=str(bpe)), label, config)
