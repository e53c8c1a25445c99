"""Whether a run learned: the two ways a scaled Transformer was seen to fail to train, judged by its last dev PPL.

On the unigram plateau, the model predicts each target token by its training frequency and ignores the source;
collapsed, it does worse than a uniform guess over the vocabulary (docs/ablations.md, "The init rule").
A budget's baseline (the unigram PPL of its data) is written beside its published results, so that the reports can
judge every run without the data.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from plumbing.files import write_atomic

if TYPE_CHECKING:  # the reports read baselines without importing the training side
    from ablations.grid.runner import PreparedData

PUBLISHED = "baseline.json"  # beside a budget's results.csv


@dataclass(frozen=True)
class Baseline:
    """The two thresholds of a budget's data: the unigram model's dev PPL and the vocabulary size (uniform PPL)."""

    unigram_ppl: float
    vocab: int
    dev_pairs: int  # the dev pairs the unigram PPL was measured on

    @property
    def plateau(self) -> float:
        """Dev PPL above this (half the unigram PPL) is on the plateau: within 2x of ignoring the source."""
        return self.unigram_ppl / 2

    def verdict(self, dev_ppl: float | None) -> str:
        """'collapsed' above the uniform PPL (or not finite), 'plateau' above half the unigram PPL, else 'learns'."""
        if dev_ppl is None or not math.isfinite(dev_ppl) or dev_ppl > self.vocab:
            return "collapsed"
        return "plateau" if dev_ppl > self.plateau else "learns"

    def rule(self) -> str:
        """The thresholds in words, for a report's legend."""
        return (
            f"plateau: dev PPL above {self.plateau:.0f}, half the unigram PPL of {self.unigram_ppl:.0f} on "
            f"{self.dev_pairs} dev pairs; collapsed: above {self.vocab}, the vocabulary size (a uniform guess)"
        )


def measure(data: PreparedData) -> Baseline:
    """The baseline of prepared data: dev PPL of predicting every target token by its training frequency (add-one)."""
    counts = Counter(token for sentence in data.train_tgt for token in sentence)
    vocab = data.sp.get_piece_size()
    total = sum(counts.values()) + vocab
    dev = [token for sentence in data.dev_tgt for token in sentence]
    unigram = math.exp(-sum(math.log((counts[t] + 1) / total) for t in dev) / len(dev))
    return Baseline(unigram, vocab, len(data.dev_tgt))


def write(folder: Path, baseline: Baseline) -> Path:
    path = folder / PUBLISHED
    write_atomic(path, json.dumps(asdict(baseline), indent=1) + "\n")
    return path


def read(folder: Path) -> Baseline | None:
    """The baseline published in folder; None where there is none; a one-line ValueError where it is damaged."""
    path = folder / PUBLISHED
    if not path.is_file():
        return None
    try:
        fields = json.loads(path.read_text())
        return Baseline(float(fields["unigram_ppl"]), int(fields["vocab"]), int(fields["dev_pairs"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{path} is damaged ({type(exc).__name__}: {exc}); delete it and rerun: python -m ablations publish"
        ) from None
