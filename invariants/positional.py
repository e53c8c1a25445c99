"""Invariant 4: the sinusoidal positional encoding of section 3.5, by its algebra and by its exact values.

Relative-position linearity alone misses real bugs (sin and cos concatenated instead of interleaved,
a wrong exponent, positions counted from 1), so the exact values are checked too. A learned encoding
is reported as not sinusoidal, with its measured linear-map residual, rather than failed or crashed.

The fitted M_k is not compared entry by entry with the rotation: at low frequencies sin(p * omega) ~ p * omega
for every such pair, the columns are nearly collinear and the least-squares M_k is not unique. Instead the
fit's residual shows that a linear map exists, and the paper's rotation is checked to be one (it maps PE(p)
to PE(p + k) at every p).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import invariant
from invariants.subject import Subject

GROUP = "4 positional encoding"
POSITIONS = 1024  # rows of the table examined (fewer if max_len is smaller)


def table(subject: Subject, config: str) -> Tensor:
    model = subject.model(config)
    return model.positional_table(min(model.config.max_len, POSITIONS)).detach().double()


def frequencies(d_model: int) -> Tensor:
    """omega_i = 1 / 10000^(2i / d_model), the paper's frequencies."""
    return 1.0 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def linear_fit_residual(pe: Tensor, k: int) -> float:
    """Relative residual of the best linear map M_k with PE(p + k) = M_k PE(p), fitted by least squares over all p."""
    X, Y = pe[:-k], pe[k:]
    M = torch.linalg.lstsq(X, Y).solution
    return ((X @ M - Y).norm() / Y.norm()).item()


def not_sinusoidal(subject: Subject) -> str | None:
    if subject.config.pe != "learned":
        return None
    residual = linear_fit_residual(table(subject, ""), 1)
    return f"pe='learned' is not sinusoidal (least-squares residual of PE(p+1) = M PE(p): {residual:.3g})"


def offsets(subject: Subject) -> st.SearchStrategy:
    return st.tuples(small_configs(), st.integers(1, 64))


@invariant(GROUP, tol.PE_VALUES, pinned=lambda s: [("", 1), ("", 17)], cases=offsets,
           needs=("positional_table",), applicable=not_sinusoidal)
def pe_relative_linearity(subject: Subject, config_offset: tuple[str, int]) -> float:
    """For each offset k, PE(p+k) = M_k PE(p) with M_k the block-diagonal rotation by k*omega_i, and PE(p).PE(p+k) depends on k only.

    Measured as the largest of: the least-squares fit residual of one linear M_k over all positions,
    the max error of the paper's rotation applied to PE(p), and the spread over p of PE(p).PE(p+k) / (d_model/2).
    """
    config, k = config_offset
    pe = table(subject, config)
    if k >= pe.size(0):
        return 0.0
    X, Y = pe[:-k], pe[k:]
    c, s = torch.cos(k * frequencies(pe.size(1))), torch.sin(k * frequencies(pe.size(1)))
    rotated = torch.empty_like(X)
    rotated[:, 0::2] = X[:, 0::2] * c + X[:, 1::2] * s  # sin(a + b) = sin a cos b + cos a sin b
    rotated[:, 1::2] = X[:, 1::2] * c - X[:, 0::2] * s  # cos(a + b) = cos a cos b - sin a sin b
    dots = (X * Y).sum(-1) / (pe.size(1) / 2)
    fit = linear_fit_residual(pe, k) if X.size(0) >= X.size(1) else 0.0  # underdetermined fits are exact anyway
    return max(fit, (rotated - Y).abs().max().item(), (dots.max() - dots.min()).item())


@invariant(GROUP, tol.PE_VALUES, pinned=lambda s: [("", 0), ("", 1)],
           cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
           needs=("positional_table",), applicable=not_sinusoidal)
def pe_exact_values(subject: Subject, config_seed: tuple[str, int]) -> float:
    """PE[0] = [0, 1, 0, 1, ...] and PE[p, 2i] = sin(p / 10000^(2i/d_model)), PE[p, 2i+1] = cos(...) at sampled points (interleaved)."""
    config, seed = config_seed
    pe = table(subject, config)
    positions, d_model = pe.shape
    gen = torch.Generator().manual_seed(seed)
    p = torch.cat([torch.zeros(1), torch.randint(0, positions, (31,), generator=gen)]).long().double()
    angle = p[:, None] * frequencies(d_model)[None, :]
    expected = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)  # sin, cos interleaved
    return (pe[p.long()] - expected).abs().max().item()
