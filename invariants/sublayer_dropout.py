"""Invariant 7, continued: residual dropout (section 5.4), "applied to the output of each sub-layer, before it is
added to the sub-layer input and normalized", and to the sums of the embeddings and positional encodings.

Zero every sub-layer (weights and biases, normalisations kept): each then outputs exactly 0, so dropout on its
output changes nothing, and in train mode the only dropout left on the path is the embeddings'. Feed inputs
that are huge two-hot vectors, s * (e_j - e_k): the embedding dropout either keeps both coordinates (probability
(1 - p)^2) and the output is the eval output, or it does not. A LayerNorm maps such a vector to itself (its mean
is 0), so a model that normalises the embeddings before their dropout behaves the same. A stack that drops the
residual stream (dropout after the residual sum, or after the LayerNorm) draws a new mask at every sub-layer, and
the share of outputs left as in eval falls to (1 - p)^(2 (1 + sub-layers)) or less.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import invariant
from invariants.residual import GROUP, without_sublayer_weights
from invariants.subject import OWN_CONFIG, Overrides, Subject, seeded

P_DROP = 0.3  # both coordinates of a two-hot survive a mask with probability 0.49
SCALE = 1e8  # of the two-hot inputs: the positional encoding beside them moves a normalised output by ~1e-8
SAMPLES, LENGTH = 32, 8  # sequences x positions: 256 independent positions (sub-layers computing 0 do not mix them)
SAME = 1e-3  # relative difference counted as the eval output: LayerNorm eps shifts a rescaled input by ~eps/2, a lost coordinate by O(1)


def two_hot(batch: int, length: int, d_model: int, gen: torch.Generator) -> Tensor:
    """(batch, length, d_model) float64 rows SCALE * (e_j - e_k), j != k drawn for each position."""
    j = torch.randint(0, d_model, (batch, length, 1), generator=gen)
    k = (j + torch.randint(1, d_model, (batch, length, 1), generator=gen)) % d_model
    rows = torch.zeros(batch, length, d_model, dtype=torch.float64)
    return rows.scatter_(-1, j, SCALE).scatter_(-1, k, -SCALE)


def share_as_in_eval(train: Tensor, evaluated: Tensor) -> float:
    """The share of positions whose train-mode output equals the eval output, relative to the eval row's size."""
    difference = (train - evaluated).abs().amax(-1) / evaluated.abs().amax(-1).clamp_min(1e-300)
    return (difference < SAME).double().mean().item()


@invariant(GROUP, tol.RESIDUAL_DROPOUT, pinned=lambda s: [(OWN_CONFIG, 0)],
           cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)))
def residual_dropout(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With every sub-layer computing 0, train mode leaves an output as in eval whenever the embedding dropout spares its input: dropout acts on sub-layer outputs, not on the residual stream (paper, section 5.4)."""
    config, seed = case
    model = without_sublayer_weights(subject, {**config, "P_drop": P_DROP}, biases=True)
    length = min(LENGTH, model.config.max_len)
    inputs = two_hot(SAMPLES, length, model.config.d_model, torch.Generator().manual_seed(seed))
    pad = torch.zeros(SAMPLES, length, dtype=torch.bool)
    memory = model.encode(inputs, pad)
    logits = model.decode(inputs, memory, pad, pad)
    model.train()  # a fresh copy: nothing to restore
    with seeded(seed):
        encoder = share_as_in_eval(model.encode(inputs, pad), memory)
        decoder = share_as_in_eval(model.decode(inputs, memory, pad, pad), logits)
    dropped = [f"{name} ({share:.1%} as in eval)" for name, share in (("encoder outputs", encoder), ("decoder logits", decoder))
               if not share >= tol.RESIDUAL_DROPOUT.value]
    return min(encoder, decoder), (f"{' and '.join(dropped)}, expected ~{(1 - P_DROP) ** 2:.0%}: dropout reaches the "
                                   f"residual stream, or drops more than P_drop={P_DROP}" if dropped else "")
