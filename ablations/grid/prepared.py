"""A budget's encoded data saved once, so that a timed command (the GPU benchmark) loads it in about a second instead
of reading the corpus, training a BPE and encoding: `<folder>/<budget>/` holds the BPE model, the ids as compact
arrays (uint16 while the vocabulary allows, else int32; compressed) and what else PreparedData holds. Written by the GPU check's
--prepare step on the CPU; any change of the budget's data settings makes a saved folder stale (not loaded).
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import sentencepiece as spm

from ablations.data.corpora import DataError
from ablations.grid.runner import PreparedData
from ablations.runs.budgets import budget
from plumbing.files import write_atomic

FORMAT = 1  # raise when the layout below changes: older folders are then stale
SETS = ("train_src", "train_tgt", "dev_src", "dev_tgt")
IDS, BPE, META = "ids.npz", "bpe.model", "meta.json"  # meta.json is written last: the folder is whole when it is there


def settings(budget_name: str) -> dict:
    """What the saved data depends on besides the corpus: the budget's data settings and this layout's version."""
    b = budget(budget_name)
    keys = ("name", "preset", "vocab_size", "max_train_pairs", "dev_pairs", "max_sentence_tokens")
    return {"format": FORMAT, **{k: v for k, v in dataclasses.asdict(b).items() if k in keys}}


def save_prepared(data: PreparedData, folder: Path, budget_name: str) -> Path:
    """Write `data` (prepared for the budget `budget_name`) to `<folder>/<budget_name>/`; returns that folder."""
    where = folder / budget_name
    where.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if data.sp.get_piece_size() <= 2**16 else np.int32
    arrays = {}
    for name in SETS:
        rows = getattr(data, name)
        arrays[f"{name}_ids"] = np.fromiter((i for row in rows for i in row), dtype=dtype)
        arrays[f"{name}_lengths"] = np.fromiter((len(row) for row in rows), dtype=np.int32, count=len(rows))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # a third of the size: the folder travels to the GPU machine
    write_atomic(where / IDS, buffer.getvalue())
    write_atomic(where / BPE, data.sp.serialized_model_proto())
    about = {"settings": settings(budget_name), "preset": data.preset, "bpe_key": data.bpe_key}
    write_atomic(where / META, json.dumps({**about, "summary": data.summary, "dev_refs": data.dev_refs}) + "\n")
    return where


def _rows(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    flat, ends = ids.tolist(), np.cumsum(lengths).tolist()
    return [flat[end - n : end] for end, n in zip(ends, lengths.tolist())]


def load_prepared(folder: Path, budget_name: str) -> PreparedData | None:
    """The data save_prepared wrote for the budget `budget_name`; None when there is none, or it was saved under
    other settings (stale). A damaged folder is a one-line DataError naming it."""
    where = folder / budget_name
    if not (where / META).is_file():
        return None
    try:
        about = json.loads((where / META).read_text())
        if about.get("settings") != settings(budget_name):
            return None
        with np.load(where / IDS, allow_pickle=False) as arrays:
            sets = {name: _rows(arrays[f"{name}_ids"], arrays[f"{name}_lengths"]) for name in SETS}
        sp = spm.SentencePieceProcessor(model_proto=(where / BPE).read_bytes())
        return PreparedData(
            about["preset"], sp, about["bpe_key"], **sets, dev_refs=about["dev_refs"], summary=about["summary"]
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise DataError(
            f"{where}: unreadable prepared data ({type(exc).__name__}); delete it and prepare again"
        ) from None
