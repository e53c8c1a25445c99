"""The decoder's cross-attention (section 3.2.3): its keys and values are the encoder's output, and its sub-layer, like
every other, adds its own input back (section 3.1).

`source_reaches_logits`: "the queries come from the previous decoder layer, and the memory keys and values come from
the output of the encoder". A decoder whose cross-attention reads the decoder's own states instead computes logits that
no change of the source can move, and its captured cross-attention has one key per target position, not one per
source position.

`residual_own_input`: the cross-attention sub-layer computes LayerNorm(x + CrossAttention(x, memory)) where x is its own
input, the self-attention sub-layer's output. A residual that adds the layer's input instead (the block's first x)
drops what self-attention computed whenever cross-attention does not carry it on. With a one-token source it cannot:
attention over one key returns that key's value to every query, the same vector whatever the query. Then each target
position's logits depend only on its own token, unless the residual carries the self-attention's mixing of earlier
target positions, as the paper's does.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.behaviour import relative_change
from invariants.cases import small_configs
from invariants.engine import invariant
from invariants.residual import GROUP as RESIDUAL_GROUP
from invariants.subject import OWN_CONFIG, Overrides, Subject, tokens

GROUP = "9 cross-attention"
ROWS = 3
MOVED = 1e-9  # a relative change of the logits above float64 noise (1e-16 relative): the source moved them


def other_tokens(ids: Tensor, pad_id: int, vocab_size: int, gen: torch.Generator) -> Tensor:
    """Every (non-pad) token replaced by a different non-pad token."""
    index = ids - (ids > pad_id).long()  # position among the vocab_size - 1 non-pad ids
    shifted = (index + torch.randint(1, vocab_size - 1, ids.shape, generator=gen)) % (vocab_size - 1)
    return shifted + (shifted >= pad_id).long()


def draws(subject: Subject) -> st.SearchStrategy:
    """A small config, a source length, a target length (never equal, so that a key count tells them apart), a seed."""
    lengths = st.tuples(st.integers(1, 7), st.integers(1, 7)).filter(lambda source_target: len(set(source_target)) == 2)
    return st.tuples(small_configs(), lengths, st.integers(0, 2**16))


@invariant(GROUP, tol.SOURCE_REACH, pinned=lambda s: [(OWN_CONFIG, (5, 4), 0), (OWN_CONFIG, (3, 6), 1)], cases=draws)
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


@invariant(
    RESIDUAL_GROUP,
    tol.RESIDUAL_SOURCE,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
)
def residual_own_input(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With a one-token source (cross-attention then returns one vector to every query), changing the target tokens before the last moves its logits: the cross-attention residual adds its own input, which carries self-attention's output (paper, section 3.1)."""
    config, seed = case
    model = subject.model(config).eval()
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    T = min(6, cfg.max_len)
    source = tokens(cfg, (ROWS, 1), gen)
    target = tokens(cfg, (ROWS, T), gen)
    earlier_changed = torch.cat([other_tokens(target[:, :-1], cfg.pad_id, cfg.vocab_size, gen), target[:, -1:]], 1)
    targets = [target, earlier_changed]  # the last position's own token stays, every earlier one changes
    src_pad, tgt_pad = torch.zeros(ROWS, 1, dtype=torch.bool), torch.zeros(ROWS, T, dtype=torch.bool)
    last = [model(source, tgt, src_pad, tgt_pad)[:, -1] for tgt in targets]
    change = min(relative_change(last[0][b], last[1][b], last[0][b]) for b in range(ROWS))
    return change, (
        ""
        if change >= tol.RESIDUAL_SOURCE.value
        else "the last position's logits depend on its own token only: the residual around cross-attention adds "
        "the decoder layer's input, not the self-attention sub-layer's output"
    )
