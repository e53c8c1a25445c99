"""Invariant 7: residual connections (section 3.1): "the output of each sub-layer is LayerNorm(x + Sublayer(x))".

With every weight matrix of the encoder's and decoder's sub-layers set to zero, a sub-layer computes a constant
(its biases), so each layer is LayerNorm(x + constant): the input still reaches the output along the residual
path, and different tokens stay different. A stack that drops one residual connection computes
LayerNorm(constant) there instead, the same vector at every position, and everything after it is the same too.
The weight matrices are the 2-D trainable parameters that parameter_groups() files under "encoder" and "decoder",
less the embedding and pre-softmax matrices; the check zeroes a fresh copy, never the subject's cached model.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.subject import INIT_SEED, OWN_CONFIG, Overrides, Subject, seeded, tokens
from model.protocol import Seq2SeqModel

GROUP = "7 residual connections"
TOKENS = 8  # distinct tokens in the probe sequence (fewer when the vocabulary is smaller)


def without_sublayer_weights(subject: Subject, config: Overrides) -> Seq2SeqModel:
    """A fresh float64 copy of the subject with the encoder's and decoder's weight matrices zeroed."""
    with seeded(INIT_SEED):
        model = subject.build(config).double().eval()
    groups = model.parameter_groups()
    if not {"encoder", "decoder"} <= set(groups):
        raise NotApplicable(f"parameter_groups() names no encoder and decoder groups (it has {', '.join(groups)})")
    kept = {w.untyped_storage().data_ptr() for w in model.embedding_weights().values()}
    with torch.no_grad():
        for p in [*groups["encoder"], *groups["decoder"]]:
            if p.dim() >= 2 and p.untyped_storage().data_ptr() not in kept:
                p.zero_()
    return model


def distinctness(rows: Tensor) -> float:
    """The smallest max-abs difference between two rows of (n, d), relative to the largest entry (at least 1)."""
    gaps = (rows[:, None] - rows[None]).abs().amax(-1)
    gaps.fill_diagonal_(float("inf"))
    return gaps.min().item() / max(1.0, rows.abs().max().item())


@invariant(GROUP, tol.RESIDUAL, pinned=lambda s: [(OWN_CONFIG, 0)],
           cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)))
def residual_paths(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With the sub-layers' weight matrices zeroed, distinct tokens still give distinct encoder outputs and logits: each sub-layer's input reaches its output (paper, section 3.1)."""
    config, seed = case
    model = without_sublayer_weights(subject, config)
    if model.config.d_model <= 2:
        raise NotApplicable("d_model <= 2: LayerNorm maps every vector to one of two points, so tokens cannot stay apart")
    n = min(TOKENS, model.config.vocab_size - 1)
    ids = tokens(model.config, (1, n), torch.Generator().manual_seed(seed), distinct=True)
    pad = torch.zeros_like(ids, dtype=torch.bool)
    with torch.no_grad():
        memory = model.encode(ids, pad)
        logits = model.decode(ids, memory, pad, pad)
    encoder, decoder = distinctness(memory[0]), distinctness(logits[0])
    lost = [name for name, d in (("encoder outputs", encoder), ("decoder logits", decoder)) if not d >= tol.RESIDUAL.value]
    return min(encoder, decoder), (f"{' and '.join(lost)} are the same at every position: a residual path is missing" if lost else "")
