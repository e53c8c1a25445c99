"""The decoder's cross-attention (section 3.2.3): its keys and values are the encoder's output; that its sub-layer adds
its own input back (section 3.1) is residual.py's `residual_own_input`.

`source_reaches_logits`: "the queries come from the previous decoder layer, and the memory keys and values come from
the output of the encoder". A decoder whose cross-attention reads the decoder's own states instead computes logits that
no change of the source can move, and its captured cross-attention has one key per target position, not one per
source position.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import invariant
from invariants.groups import CROSS_ATTENTION
from invariants.measure import other_tokens
from invariants.subject import OWN_CONFIG, Overrides, Subject, tokens

ROWS = 3
MOVED = 1e-9  # a relative change of the logits above float64 noise (1e-16 relative): the source moved them


def draws(subject: Subject) -> st.SearchStrategy:
    """A small config, a source length, a target length (never equal, so that a key count tells them apart), a seed."""
    lengths = st.tuples(st.integers(1, 7), st.integers(1, 7)).filter(lambda source_target: len(set(source_target)) == 2)
    return st.tuples(small_configs(), lengths, st.integers(0, 2**16))


@invariant(
    CROSS_ATTENTION, tol.SOURCE_REACH, pinned=lambda s: [(OWN_CONFIG, (5, 4), 0), (OWN_CONFIG, (3, 6), 1)], cases=draws
)
def source_reaches_logits(subject: Subject, case: tuple[Overrides, tuple[int, int], int]) -> tuple[float, str]:
    """Changing every source token moves the logits at every target position, and each captured cross-attention record has one key column per source position (paper, section 3.2.3)."""
    config, (S, T), seed = case
    model = subject.model(config).eval()
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    S, T = min(S, cfg.max_len), min(T, cfg.max_len)
    sources = [tokens(cfg, (ROWS, S), gen)]
    sources.append(other_tokens(sources[0], cfg.pad_id, cfg.vocab_size, gen))
    target = tokens(cfg, (ROWS, T), gen)
    src_pad, tgt_pad = torch.zeros(ROWS, S, dtype=torch.bool), torch.zeros(ROWS, T, dtype=torch.bool)
    logits = [model(src, target, src_pad, tgt_pad) for src in sources]
    moved = (logits[0] - logits[1]).abs().amax(-1) / logits[0].abs().amax((-1, -2), keepdim=True)[..., 0].clamp_min(
        1e-300
    )
    unmoved = int((~(moved > MOVED)).sum())  # NaN counts as unmoved: nothing observable came through
    notes = [f"{unmoved} of {ROWS * T} target positions whose logits no change of the source moves"] if unmoved else []
    wrong = 0
    if not subject.lacks("attention_probs"):
        with model.attention_probs() as records:
            model(sources[0], target, src_pad, tgt_pad)
        cross = [r for r in records if r.kind == "cross"]
        keyed_otherwise = [r for r in cross if r.probs.size(-1) != S]
        wrong = len(keyed_otherwise) + (not cross)
        if not cross:
            notes.append("attention_probs() recorded no cross-attention")
        elif keyed_otherwise:
            notes.append(
                f"{len(keyed_otherwise)} of {len(cross)} cross-attention records with "
                f"{keyed_otherwise[0].probs.size(-1)} key columns for {S} source positions: cross-attention "
                f"does not read the encoder's output"
            )
    return unmoved + wrong, "; ".join(notes)
