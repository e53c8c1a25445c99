"""The cases hypothesis draws: small random configs (as spec overrides), batch shapes, padding, modes and seeds."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import strategies as st

from invariants.subject import OWN_CONFIG, Overrides, Subject, random_batch
from model.batch import Batch
from model.registry import format_config_overrides

# A small config is config overrides set on top of the spec, so it works for any adapter that honours
# the config. h * d_k == h * d_v == d_model keeps it buildable by torch.nn.Transformer too.
SMALL_MAX_LEN = 128


@st.composite
def small_configs(draw: st.DrawFn) -> Overrides:
    h, d_k = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4, 8]))
    N, d_ff, vocab = draw(st.integers(1, 2)), draw(st.sampled_from([16, 32, 64])), draw(st.sampled_from([23, 50]))
    return {
        "N": N,
        "d_model": h * d_k,
        "h": h,
        "d_k": d_k,
        "d_v": d_k,
        "d_ff": d_ff,
        "vocab_size": vocab,
        "max_len": SMALL_MAX_LEN,
    }


@dataclass(frozen=True)
class Case:
    """One batch through one model: config overrides ({} = the spec's own), shape, padding, mode, capture, seed."""

    config: Overrides
    batch: int
    src_len: int
    tgt_len: int
    padded: bool  # ragged right padding on source and target
    train: bool  # dropout active (with the global RNG seeded from `seed`)
    capture: bool  # attention probabilities requested (the explicit path, on which real leaks hid)
    seed: int
    side: str = "right"  # the side the source is padded on (model.protocol.PADDING_SIDES)

    def make_batch(self, subject: Subject, distinct: bool = False) -> Batch:
        cfg = subject.model(self.config).config
        return random_batch(
            cfg,
            self.batch,
            self.src_len,
            self.tgt_len,
            self.padded,
            self.seed,
            distinct,
            self.side if self.padded else "right",
        )

    def __repr__(self) -> str:
        config = format_config_overrides(self.config) or "the spec's own config"
        flags = [name for name in ("padded", "train", "capture") if getattr(self, name)]
        if self.padded and self.side != "right":
            flags[0] = f"padded on the {self.side}"
        return (
            f"Case({config}; B={self.batch} S={self.src_len} T={self.tgt_len}"
            f"{' ' if flags else ''}{' '.join(flags)} seed={self.seed})"
        )


def batch_cases(
    subject: Subject,
    train: bool | None = None,
    capture: bool | None = None,
    padded: bool | None = None,
    min_batch: int = 1,
    min_src: int = 1,
    min_tgt: int = 1,
) -> st.SearchStrategy[Case]:
    """Cases on random small configs; a flag given as True/False is fixed, None lets hypothesis choose.

    capture is only drawn when the model can capture attention probabilities (declared, or found by trying it).
    """
    can_capture = not subject.lacks("attention_probs")
    flag = lambda fixed: st.just(fixed) if fixed is not None else st.booleans()  # noqa: E731
    return st.builds(
        Case,
        small_configs(),
        st.integers(min_batch, 3),
        st.integers(min_src, 7),
        st.integers(min_tgt, 7),
        flag(padded),
        flag(train),
        flag(capture) if can_capture else st.just(False),
        st.integers(0, 2**16),
        st.sampled_from(subject.padding_sides),
    )


def pinned_cases(
    subject: Subject,
    train=(False, True),
    capture=(False, True),
    padded=(False, True),
    src_len: int = 5,
    tgt_len: int = 4,
) -> list[Case]:
    """Flag combinations on the spec's own config (the 65M base model by default), two examples wide.

    The base model is expensive, so when two or three flags are free only the combinations with an even
    number of True run: with three that is an orthogonal array covering every pair of flag values, with
    two it is all-off and all-on. The drawn small configs cover every combination.
    """
    if subject.lacks("attention_probs"):
        capture = tuple(c for c in capture if not c) or (False,)
    combos = list(itertools.product(train, capture, padded))
    if sum(len(flag) > 1 for flag in (train, capture, padded)) >= 2:
        combos = [combo for combo in combos if sum(combo) % 2 == 0]
    sides = subject.padding_sides
    return [
        Case(OWN_CONFIG, 2, src_len, tgt_len, p, t, c, seed, sides[seed % len(sides)])
        for seed, (t, c, p) in enumerate(combos)
    ]
