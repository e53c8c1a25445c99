"""The shared source-target BPE vocabulary (sentencepiece), trained once and cached by a hash of its inputs.

Ids: 0 pad (the model's pad_id), 1 unk, 2 bos, 3 eos. The model file lives in `<runs>/cache/`, never in git.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import sentencepiece as spm

from ablations.data import DataError, Pairs

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


def _options(vocab_size: int) -> dict[str, object]:
    return dict(
        model_type="bpe", vocab_size=vocab_size, character_coverage=1.0, normalization_rule_name="identity",
        pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, input_sentence_size=2_000_000, shuffle_input_sentence=True,
        seed_sentencepiece_size=1_000_000, num_threads=min(16, os.cpu_count() or 1), minloglevel=2,
    )


def shared_bpe(train: Pairs, vocab_size: int, cache_dir: Path) -> spm.SentencePieceProcessor:
    """Train (or load from the cache) one BPE model on the English and German training sentences together."""
    path = cache_dir / f"bpe-{vocab_size}-{bpe_key(train, vocab_size)}.model"
    if not path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(train.src + train.tgt), model_writer=model, **_options(vocab_size))
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise DataError(f"sentencepiece could not train a {vocab_size}-token BPE on {len(train)} pairs ({first}); use a smaller vocabulary") from None
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(model.getvalue())
        os.replace(tmp, path)
    return spm.SentencePieceProcessor(model_file=str(path))


def encode(sp: spm.SentencePieceProcessor, pairs: Pairs) -> tuple[list[list[int]], list[list[int]]]:
    """Source ids end with EOS; target ids are the bare sentence (the batcher adds BOS and EOS)."""
    src = [ids + [EOS] for ids in sp.encode(list(pairs.src))]
    return src, sp.encode(list(pairs.tgt))
