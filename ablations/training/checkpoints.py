"""Checkpoints of a training run: everything needed to continue it exactly, behind a SHA-256 of it.

A checkpoint holds the model, the optimizer, the step, the RNG states and the batch stream's position (`TrainState`),
so that a run resumed from it continues exactly as if it had never stopped (on CPU). Each file starts with a SHA-256
of its contents and the previous one is kept beside it, so a checkpoint cut short or corrupted is detected and the
run resumes from the one before; another run's checkpoint is set aside, not loaded.
"""

from __future__ import annotations

import hashlib
import io
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ablations.runs.folder import CHECKPOINT, previous_checkpoint, set_aside
from plumbing.files import replace, temporary, write_file


@dataclass
class TrainState:
    """Progress that a checkpoint carries besides the weights and the optimizer."""

    step: int = 0
    tokens_seen: int = 0  # non-pad source + target tokens trained on
    wall_s: float = 0.0  # seconds of training steps, all resumptions: compiling included, evaluating and saving not
    compile_s: float = 0.0  # of which in steps where torch.compile compiled a graph
    compiles: int = 0  # graphs torch.compile compiled
    steady_s: float = 0.0  # of which in steps that compiled nothing (counted from the resume in older checkpoints)
    steady_tokens: int = 0  # the tokens those steps trained on
    epoch: int = 0  # the batch stream's position
    index: int = 0


class CorruptCheckpoint(ValueError):
    """A checkpoint file cut short or altered: its contents do not match the SHA-256 it starts with."""


CHECKSUM_HEADER = b"aiayn-checkpoint sha256="  # + 64 hex digits + newline, then the torch.save bytes


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, run_id: str | None = None
) -> None:
    """Everything needed to continue the run exactly, behind a SHA-256 of it; the latest checkpoint becomes the previous.

    `run_id` (the run's config hash) marks whose checkpoint it is. Written to a temporary file private to this
    process and renamed: a kill at any moment leaves the latest or the previous checkpoint whole.
    """
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "state": asdict(state),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "run": run_id,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    tmp = temporary(path)
    write_file(tmp, CHECKSUM_HEADER + hashlib.sha256(body).hexdigest().encode() + b"\n" + body, path)
    if path.is_file():
        replace(path, previous_checkpoint(path))
    replace(tmp, path)


def read_checkpoint(path: Path) -> dict:
    """A checkpoint's contents (tensors on the CPU) once its checksum holds; raises CorruptCheckpoint otherwise."""
    data = path.read_bytes()
    header, _, body = data.partition(b"\n")
    if (
        not header.startswith(CHECKSUM_HEADER)
        or header[len(CHECKSUM_HEADER) :] != hashlib.sha256(body).hexdigest().encode()
    ):
        raise CorruptCheckpoint(f"{path.name} fails its checksum ({len(data)} bytes): cut short or corrupted")
    return torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)


class ForeignCheckpoint(ValueError):
    """An intact checkpoint of another run: another config hash, or weights of other names or shapes."""


def check_belongs(payload: dict, model: nn.Module, run_id: str | None) -> None:
    """Raise ForeignCheckpoint unless the checkpoint is this run's, checked before anything is loaded from it."""
    if run_id is not None and payload.get("run") not in (None, run_id):
        raise ForeignCheckpoint(f"it belongs to run {payload.get('run')}, not {run_id}")
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in payload["model"].items()}
    if ours != theirs:
        different = sorted(set(ours) ^ set(theirs)) or [k for k in ours if ours[k] != theirs[k]]
        raise ForeignCheckpoint(f"its weights do not fit this model ({len(different)} differ, e.g. {different[0]})")


def load_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, run_id: str | None = None
) -> TrainState:
    """Restore model, optimizer and RNG states in place; returns the progress. A damaged file raises
    CorruptCheckpoint, another run's ForeignCheckpoint, before anything is restored."""
    payload = read_checkpoint(path)
    check_belongs(payload, model, run_id)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng_cpu"])
    if payload["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["rng_cuda"])
    return TrainState(**payload["state"])


def resume(
    run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, label: str = "", run_id: str | None = None
) -> TrainState:
    """Load the latest intact checkpoint of this run (the latest, else the previous), saying which; a fresh state if none.

    Another run's checkpoint is set aside (renamed to checkpoint.pt.foreign, not deleted) with a notice.
    """
    label = label or run_dir.name
    latest = run_dir / CHECKPOINT
    for path in (latest, previous_checkpoint(latest)):
        if not path.is_file():
            continue
        try:
            state = load_checkpoint(path, model, optimizer, run_id)
        except CorruptCheckpoint as exc:
            print(f"{label}: {exc}; trying the previous checkpoint", file=sys.stderr)
            continue
        except ForeignCheckpoint as exc:
            aside = set_aside(path, "foreign")
            print(f"{label}: {path} is not this run's checkpoint ({exc}); set aside as {aside.name}", file=sys.stderr)
            continue
        print(f"{label}: resuming from {path.name} at step {state.step}", file=sys.stderr)
        return state
    if latest.is_file() or previous_checkpoint(latest).is_file():
        print(f"{label}: no intact checkpoint in {run_dir}; starting from step 0", file=sys.stderr)
    return TrainState()
