"""The shared source-target BPE vocabulary (sentencepiece), trained once and cached by a hash of its inputs.

Ids: 0 pad (the model's pad_id), 1 unk, 2 bos, 3 eos. The model file lives in `<runs>/cache/`, never in git.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import sys
import time
from pathlib import Path

import sentencepiece as spm
from tqdm.auto import tqdm

from ablations.data.corpora import DataError, Pairs
from plumbing.files import StorageError, write_atomic

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def bpe_key(train: Pairs, vocab_size: int) -> str:
    """A hash of everything the vocabulary depends on: the text, the size, the options, sentencepiece's version."""
    h = hashlib.sha256(f"bpe|{vocab_size}|{spm.__version__}|{sorted(_options(vocab_size).items())}".encode())
    for s, t in zip(train.src, train.tgt):
        h.update(s.encode())
        h.update(b"\t")
        h.update(t.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def bpe_file(vocab_size: int, key: str) -> str:
    """The BPE model's file name in the cache: bpe-<vocab>-<key>.model (key: bpe_key, recorded in a run's config.json)."""
    return f"bpe-{vocab_size}-{key}.model"


def _options(vocab_size: int) -> dict[str, object]:
    return dict(
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        normalization_rule_name="identity",
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        seed_sentencepiece_size=1_000_000,
        num_threads=2,  # fixed, as it is in the cache key: a BPE made on one machine serves every other
        minloglevel=2,
    )


def shared_bpe(train: Pairs, vocab_size: int, cache_dir: Path) -> spm.SentencePieceProcessor:
    """Train (or load from the cache) one BPE model on the English and German training sentences together.

    Processes started side by side wait for the one that trains it (a lock beside the cached file) and load it."""
    path = cache_dir / bpe_file(vocab_size, bpe_key(train, vocab_size))
    if not path.is_file():
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(cache_dir, exc) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process dies
            if not path.is_file():
                write_atomic(path, _train(train, vocab_size))
        finally:
            os.close(lock)
    return spm.SentencePieceProcessor(model_file=str(path))


def _train(train: Pairs, vocab_size: int) -> bytes:
    print(
        f"training a shared BPE of {vocab_size} tokens on {2 * len(train)} sentences (once: it is cached)...",
        end="",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(train.src + train.tgt), model_writer=model, **_options(vocab_size)
        )
    except RuntimeError as exc:
        print(file=sys.stderr)
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"sentencepiece could not train a {vocab_size}-token BPE on {len(train)} pairs ({first}); use a smaller vocabulary"
        ) from None
    print(f" done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return model.getvalue()


def encode(
    sp: spm.SentencePieceProcessor, pairs: Pairs, progress: str | None = None, chunk: int = 20_000
) -> tuple[list[list[int]], list[list[int]]]:
    """Source ids end with EOS; target ids are the bare sentence (the batcher adds BOS and EOS).
    With `progress` (a label), a bar counts the pairs encoded."""
    src: list[list[int]] = []
    tgt: list[list[int]] = []
    with tqdm(
        total=len(pairs), desc=progress, unit="pair", leave=False, dynamic_ncols=True, disable=progress is None
    ) as bar:
        for start in range(0, len(pairs), chunk):
            src += [ids + [EOS] for ids in sp.encode(list(pairs.src[start : start + chunk]))]
            tgt += sp.encode(list(pairs.tgt[start : start + chunk]))
            bar.update(min(chunk, len(pairs) - start))
    return src, tgt
