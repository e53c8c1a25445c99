"""The cases hypothesis draws for decoder-only models: small configs of the spec's own family (as overrides), batch
shapes, padding on the sides the model supports, modes and seeds."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants.lm.subject import LMSubject
from invariants.subject import OWN_CONFIG, Overrides, tokens
from model.lm.config import LMConfig
from model.registry import format_config_overrides

SMALL_MAX_LEN = 64


@st.composite
def small_lm_configs(draw: st.DrawFn, own: LMConfig) -> Overrides:
    """Sizes drawn small; what makes the family (positions, norms, FFN, tying) stays the spec's own. A family with
    grouped-query attention draws key/value heads below the query heads, one with a window draws windows shorter than
    the cases' sequences."""
    n_heads, d_head = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4, 8]))
    overrides: dict[str, object] = {
        "n_layers": draw(st.integers(1, 2)),
        "d_model": n_heads * d_head,
        "n_heads": n_heads,
        "d_ff": draw(st.sampled_from([16, 32])),
        "vocab_size": draw(st.sampled_from([23, 50])),
        "max_len": SMALL_MAX_LEN,
    }
    if own.n_kv_heads:
        overrides["n_kv_heads"] = draw(st.sampled_from([k for k in (1, 2) if n_heads % k == 0 and k <= n_heads]))
    if own.window:
        overrides["window"] = draw(st.integers(1, 5))
    return overrides


@dataclass(frozen=True)
class LMCase:
    """One batch through one model: config overrides ({} = the spec's own), shape, padding, mode and seed."""

    config: Overrides
    batch: int
    length: int
    padded: bool  # rows after the first are shorter, padded on `side`
    side: str
    train: bool  # dropout active, the global RNG seeded from `seed`
    seed: int

    def make_batch(self, subject: LMSubject) -> tuple[Tensor, Tensor]:
        """(ids, pad): random non-pad tokens; with padding, rows after the first hold 1 .. length real tokens."""
        cfg = subject.model(self.config).config
        gen = torch.Generator().manual_seed(self.seed)
        ids = tokens(cfg, (self.batch, self.length), gen)
        pad = torch.zeros(self.batch, self.length, dtype=torch.bool)
        if self.padded:
            for b in range(1, self.batch):
                pad[b, int(torch.randint(1, self.length + 1, (1,), generator=gen)) :] = True
            if self.side == "left":
                pad = pad.flip(1)
        return ids.masked_fill(pad, cfg.pad_id), pad

    def __repr__(self) -> str:
        config = format_config_overrides(self.config) or "the spec's own config"
        flags = ([f"padded on the {self.side}"] if self.padded else []) + (["train"] if self.train else [])
        return (
            f"LMCase({config}; B={self.batch} T={self.length}{' ' if flags else ''}{' '.join(flags)} seed={self.seed})"
        )


def lm_cases(
    subject: LMSubject,
    train: bool | None = False,
    padded: bool | None = None,
    min_length: int = 2,
    min_batch: int = 1,
    sides: tuple[str, ...] | None = None,
) -> st.SearchStrategy[LMCase]:
    """Cases on small configs of the spec's family; a flag given as True/False is fixed, None lets hypothesis choose;
    padding on `sides` (default: those the model supports)."""
    flag = lambda fixed: st.just(fixed) if fixed is not None else st.booleans()  # noqa: E731
    return st.builds(
        LMCase,
        small_lm_configs(subject.config),
        st.integers(min_batch, 3),
        st.integers(min_length, 8),
        flag(padded),
        st.sampled_from(sides or subject.padding_sides),
        flag(train),
        st.integers(0, 2**16),
    )


def pinned_lm_cases(subject: LMSubject, train: tuple[bool, ...] = (False,), padded: bool = True) -> list[LMCase]:
    """The spec's own config (GPT-2 small's size, say) on short batches: unpadded in each mode, then padded on each
    side the model supports."""
    sides = subject.padding_sides
    unpadded = [LMCase(OWN_CONFIG, 2, 6, False, sides[0], t, i) for i, t in enumerate(train)]
    return unpadded + [LMCase(OWN_CONFIG, 3, 6, True, side, False, 10 + i) for i, side in enumerate(sides) if padded]
