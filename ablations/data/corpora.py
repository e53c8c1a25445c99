"""Parallel EN-DE corpora read in place from the data folder: presets, checks, normalisation, dev/test removal.

The data folder is `--data DIR`, else the AIAYN_DATA environment variable, else `../shared/data` relative to the working directory
(from the repository root, the checkout's sibling `shared/data`).
Files are read with split('\\n'), not splitlines(): two newstest files contain U+0085 inside lines.
Every problem with the data is a DataError whose message is one line saying what to fix.
"""

from __future__ import annotations

import gzip
import os
import random
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

ENV_VAR = "AIAYN_DATA"
DEFAULT_DIR = Path("..") / "shared" / "data"  # relative to the working directory: the repository root's sibling
HOW_TO_GET = "see docs/ablations.md, section 'Data'"
NEWS_EXTRA = [
    f"wmt_newstest_ende/extra/{name}"
    for name in (
        "news-test2008",
        "newstest2009",
        "newstest2010",
        "newstest2011",
        "newstest2012",
        "newstest2015",
        "newstest2016",
        "newstest2017",
        "newstest2018",
        "newstest2019",
        "newstest2020",
    )
]


class DataError(ValueError):
    """Missing, misaligned or empty data; the message is one line naming the problem and the fix."""


@dataclass(frozen=True)
class Preset:
    """Which files make the training, dev and test sets (paths without the .en/.de suffix), and the BPE size."""

    name: str
    train: tuple[str, ...]
    dev: str
    test: str
    vocab_size: int
    note: str


PRESETS: dict[str, Preset] = {
    "multi30k": Preset(
        "multi30k",
        ("multi30k/train",),
        "multi30k/val",
        "multi30k/test_2016_flickr",
        8000,
        "Multi30k task 1: train / val / test_2016_flickr",
    ),
    "news": Preset(
        "news",
        ("tatoeba_deu_eng_manythings_2018/deu-eng", "multi30k/train", *NEWS_EXTRA),
        "wmt_newstest_ende/newstest2013",
        "wmt_newstest_ende/newstest2014",
        16000,
        "Tatoeba + Multi30k + newstest 2008-2012, 2015-2020; dev newstest2013 (the paper's); test newstest2014",
    ),
    "wmt14": Preset(
        "wmt14",
        ("wmt14/train",),
        "wmt_newstest_ende/newstest2013",
        "wmt_newstest_ende/newstest2014",
        37000,
        "your own WMT14 EN-DE training text at <data>/wmt14/train.{en,de}; dev newstest2013; test newstest2014",
    ),
}


@dataclass(frozen=True)
class Pairs:
    """Aligned source (English) and target (German) sentences."""

    src: tuple[str, ...]
    tgt: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.src)

    def head(self, n: int | None) -> Pairs:
        return self if n is None else Pairs(self.src[:n], self.tgt[:n])


@dataclass(frozen=True)
class Corpus:
    preset: str
    train: Pairs
    dev: Pairs
    test: Pairs
    removed_overlap: int  # training pairs dropped because a side occurs in dev or test


def data_dir(option: str | os.PathLike | None = None) -> Path:
    """The data folder: the option, else $AIAYN_DATA, else ../shared/data from the working directory; a DataError if it is missing."""
    chosen = option or os.environ.get(ENV_VAR) or DEFAULT_DIR
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data folder {path} not found; pass --data DIR or set {ENV_VAR} to the folder holding multi30k/, wmt_newstest_ende/, ... ({HOW_TO_GET})"
        )
    return path


def normalise(line: str) -> str:
    """NFC, every run of whitespace (tabs, NBSP U+00A0, NEL U+0085, ...) to one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", line).split())


def _language_file(root: Path, stem: str, lang: str, preset: str) -> Path:
    for candidate in (root / f"{stem}.{lang}", root / f"{stem}.{lang}.gz"):
        if candidate.is_file():
            return candidate
    hint = PRESETS[preset].note if preset in PRESETS else HOW_TO_GET
    raise DataError(f"missing data file {root / stem}.{lang} for preset {preset!r} ({hint}; {HOW_TO_GET})")


def read_lines(path: Path) -> list[str]:
    """The file's lines, split on '\\n' only (U+0085 and U+2028 may occur inside a line)."""
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(
            f"{path}, line {line}, byte {column}: {raw[exc.start : exc.start + 1]!r} is not UTF-8; "
            f"convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_pairs(root: Path, stem: str, preset: str) -> Pairs:
    """One aligned .en/.de file pair, normalised; pairs with an empty side are dropped."""
    en_path, de_path = (_language_file(root, stem, lang, preset) for lang in ("en", "de"))
    en, de = read_lines(en_path), read_lines(de_path)
    if len(en) != len(de):
        raise DataError(
            f"{en_path} has {len(en)} lines but {de_path} has {len(de)}; the .en and .de files must be line-aligned"
        )
    kept = [(s, t) for s, t in zip(map(normalise, en), map(normalise, de)) if s and t]
    if not kept:
        raise DataError(f"corpus {root / stem}.{{en,de}} is empty (no line pair with text on both sides)")
    src, tgt = zip(*kept)
    return Pairs(src, tgt)


def shuffled(pairs: Pairs, seed: int) -> Pairs:
    """A deterministic permutation of the pairs (the same seed gives the same order on every machine)."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    return Pairs(tuple(pairs.src[i] for i in order), tuple(pairs.tgt[i] for i in order))


def preset_named(name: str) -> Preset:
    """The preset called name; a DataError listing the valid ones otherwise."""
    if name not in PRESETS:
        raise DataError(f"unknown data preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def load_corpus(
    preset: str, root: Path, max_train_pairs: int | None = None, max_dev_pairs: int | None = None, seed: int = 0
) -> Corpus:
    """The preset's training, dev and test sets; training pairs sharing a sentence with dev or test are removed,
    the rest deduplicated and shuffled by seed, then cut to max_train_pairs."""
    spec = preset_named(preset)
    dev, test = read_pairs(root, spec.dev, preset), read_pairs(root, spec.test, preset)
    held_out = set(dev.src) | set(dev.tgt) | set(test.src) | set(test.tgt)
    seen: set[tuple[str, str]] = set()
    kept: list[tuple[str, str]] = []
    removed = 0
    for stem in tqdm(spec.train, desc=f"reading {preset}", unit="file", leave=False, dynamic_ncols=True):
        part = read_pairs(root, stem, preset)
        for pair in zip(part.src, part.tgt):
            if pair[0] in held_out or pair[1] in held_out:
                removed += 1
            elif pair not in seen:
                seen.add(pair)
                kept.append(pair)
    if not kept:
        raise DataError(f"preset {preset!r}: no training pair is left after removing dev/test sentences")
    src, tgt = zip(*kept)
    train = shuffled(Pairs(src, tgt), seed).head(max_train_pairs)
    return Corpus(preset, train, dev.head(max_dev_pairs), test, removed)
