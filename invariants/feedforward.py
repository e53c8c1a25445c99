"""Invariant 8: the position-wise feed-forward networks are non-linear, FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2).

On sequences of length 1 every attention is an affine map (a softmax over one key is 1), so in eval mode the
only non-linear steps left are the FFNs' activations and the normalisations. A normalisation maps its input to
a linear function of it times one scalar (1 / its std), which adds at most one dimension to the affine span of
a set of vectors. Feed source embeddings on a circle (affine dimension 2) through the encoder: without an
activation the outputs span at most 2 + (number of normalisations) affine dimensions, 2N from section 3.1 plus
an allowance of 2 for an embedding or final LayerNorm. With ReLU each unit switches on and off around the
circle (its radius dwarfs the biases and the positional encoding, so every pre-activation changes sign), and
the kinks add dimensions. The decoder is probed the same way, its length-1 target embeddings on a circle and
one fixed length-1 memory (cross-attention to a single key is then a constant), with 3N + 2 normalisations.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.subject import OWN_CONFIG, Overrides, Subject

GROUP = "8 feed-forward networks"
EXTRA_NORMS = 2  # an embedding LayerNorm and a final LayerNorm that some correct models add
RADIUS = 10.0  # of the input circle, in units of a unit-variance embedding: far above biases and PE entries (<= 1)


def affine_span_excess(rows: Tensor, bound: int) -> float:
    """Singular value number bound + 1 of the centred rows, relative to the largest: ~1e-16 if the rows span <= bound affine dimensions."""
    values = torch.linalg.svdvals(rows - rows.mean(0))
    return (values[bound] / values[0]).item() if values[0] > 0 else 0.0


def normalisation_bounds(N: int) -> tuple[int, int]:
    """The affine dimensions a circle reaches through the encoder and through the decoder when only normalisations bend it."""
    return 2 + 2 * N + EXTRA_NORMS, 2 + 3 * N + EXTRA_NORMS


def wide_enough(config: Overrides) -> bool:
    """Outputs on the (d_model - 1)-dimensional LayerNorm sphere can exceed the decoder's bound."""
    return config["d_model"] - 1 > normalisation_bounds(config["N"])[1]


@invariant(
    GROUP,
    tol.NONLINEAR,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs().filter(wide_enough), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
)
def ffn_nonlinear(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """Along a circle of length-1 inputs, encoder outputs and logits span more dimensions than normalisation alone can add: the FFNs are non-linear (paper, eq. 2)."""
    config, seed = case
    model = subject.model(config).eval()
    cfg = model.config
    encoder_bound, decoder_bound = normalisation_bounds(cfg.N)
    if cfg.d_model - 1 <= decoder_bound or cfg.vocab_size <= decoder_bound + 1:
        raise NotApplicable(
            f"d_model={cfg.d_model} or vocab_size={cfg.vocab_size} leaves no room above "
            f"{decoder_bound} affine dimensions, all that normalisation can reach at N={cfg.N}"
        )
    gen = torch.Generator().manual_seed(seed)
    plane = torch.randn(2, cfg.d_model, generator=gen, dtype=torch.float64)
    points = max(64, 4 * (decoder_bound + 2))
    angles = torch.arange(points, dtype=torch.float64) * (2 * torch.pi / points)
    circle = (RADIUS * torch.stack([angles.cos(), angles.sin()], 1) @ plane)[:, None, :]
    pad = torch.zeros(points, 1, dtype=torch.bool)
    memory = model.encode(circle, pad)
    fixed = memory[:1].expand(points, 1, cfg.d_model)
    logits = model.decode(circle, fixed, pad, pad)
    encoder = affine_span_excess(memory[:, 0], encoder_bound)
    decoder = affine_span_excess(logits[:, 0], decoder_bound)
    flat = [
        f"{name} (at most {bound} affine dimensions)"
        for name, excess, bound in (
            ("encoder outputs", encoder, encoder_bound),
            ("decoder logits", decoder, decoder_bound),
        )
        if not excess >= tol.NONLINEAR.value
    ]
    return min(encoder, decoder), (
        f"{' and '.join(flat)}: only normalisation bends them (an FFN without its "
        f"activation, or a stack whose output has lost its input)"
        if flat
        else ""
    )
