"""The positional encoding of section 3.5 reaches both stacks, and its sinusoids are the paper's, by
algebra (PE(p + k) linear in PE(p), in any column layout) and by value (sin and cos interleaved).

The two sinusoid checks are kept apart because they fail for different reasons; whether a table is sinusoidal at all
is measured, not read from the config, and a learned table makes them not applicable. docs/invariants.md, "The
positional checks", says why each check is built as it is.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.groups import POSITIONAL
from invariants.subject import OWN_CONFIG, Overrides, Subject, distinctness, relative_error, tokens

POSITIONS = 1024  # rows of the table examined (fewer if max_len is smaller)
ROWS_PER_DIM = 1.5  # a linear fit needs at least this many equations per unknown to mean anything
SINUSOID_COLUMNS = 1e-3  # median column-recurrence residual below which a table counts as sinusoidal
REPEATS = 8  # length of the one-token sequences


def table(subject: Subject, config: Overrides) -> Tensor:
    model = subject.model(config)
    return model.positional_table(min(model.config.max_len, POSITIONS)).detach().double()


def frequencies(d_model: int) -> Tensor:
    """omega_i = 1 / 10000^(2i / d_model), the paper's frequencies."""
    return 1.0 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def linear_fit_residual(pe: Tensor, k: int) -> float:
    """Relative residual of the best linear map M_k with PE(p + k) = M_k PE(p), fitted by least squares over all p."""
    X, Y = pe[:-k], pe[k:]
    M = torch.linalg.lstsq(X, Y, driver="gelsd").solution
    return ((X @ M - Y).norm() / Y.norm()).item()


def column_residual(pe: Tensor) -> float:
    """Median over columns of the relative residual of x(p+1) + x(p-1) = a x(p) (a fitted per column): ~0 for sinusoids."""
    mid, around = pe[1:-1], pe[2:] + pe[:-2]
    a = (mid * around).sum(0) / (mid * mid).sum(0).clamp_min(1e-300)
    residual = (around - a * mid).norm(dim=0) / around.norm(dim=0).clamp_min(1e-300)
    return residual.median().item()


def fit_offsets(pe: Tensor) -> int:
    """The largest offset k that leaves at least ROWS_PER_DIM * d_model rows to fit PE(p + k) = M_k PE(p) over."""
    return pe.size(0) - int(ROWS_PER_DIM * pe.size(1))


def judged_table(subject: Subject, config: Overrides) -> Tensor:
    """The table at config, or NotApplicable when it is not sinusoidal (measured) or too short to fit."""
    pe = table(subject, config)
    positions, d_model = pe.shape
    if fit_offsets(pe) < 1:
        raise NotApplicable(
            f"the table has {positions} positions, too few for a linear fit over {d_model} dimensions "
            f"(needs more than {ROWS_PER_DIM:g} x d_model: raise max_len)"
        )
    columns = column_residual(pe)
    if columns > SINUSOID_COLUMNS:
        raise NotApplicable(
            f"the table is not sinusoidal (learned?): its columns are no sinusoids (median recurrence residual "
            f"{columns:.3g}) and PE(p+1) = M PE(p) fitted over {positions - 1} positions > {d_model} dimensions leaves "
            f"a residual of {linear_fit_residual(pe, 1):.3g}"
        )
    return pe


def offsets(subject: Subject) -> st.SearchStrategy:
    return st.tuples(small_configs(), st.integers(1, 64))


@invariant(
    POSITIONAL,
    tol.PE_VALUES,
    pinned=lambda s: [(OWN_CONFIG, 1), (OWN_CONFIG, 17)],
    cases=offsets,
    needs=("positional_table",),
)
def pe_relative_linearity(subject: Subject, config_offset: tuple[Overrides, int]) -> float:
    """For each offset k one linear map takes PE(p) to PE(p+k) at every p, in any column layout (paper, section 3.5).

    Measured as the relative residual of M_k fitted by least squares over at least 1.5 x d_model positions.
    """
    config, k = config_offset
    pe = judged_table(subject, config)
    return linear_fit_residual(pe, min(k, fit_offsets(pe)))


def interleaved(positions: Tensor, d_model: int) -> Tensor:
    """The paper's values at these positions: PE[p, 2i] = sin(p omega_i), PE[p, 2i+1] = cos(p omega_i)."""
    angle = positions[:, None] * frequencies(d_model)[None, :]
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)


def layout_note(values: Tensor, expected: Tensor) -> str:
    """Why the values differ when they are the paper's sinusoids in another column order: a note saying 'layout'."""
    concatenated = torch.cat([expected[:, 0::2], expected[:, 1::2]], dim=1)
    if (values - concatenated).abs().max().item() <= tol.PE_VALUES.value:
        return "layout: the paper's sin and cos values, but concatenated [sin ..., cos ...] rather than interleaved"
    nearest = torch.cdist(values.T, expected.T).min(dim=1).values / values.size(0) ** 0.5
    if nearest.max().item() <= tol.PE_VALUES.value:
        return "layout: every column is one of the paper's sinusoids, but in another order than sin/cos interleaved"
    return ""


@invariant(
    POSITIONAL,
    tol.PE_VALUES,
    pinned=lambda s: [(OWN_CONFIG, 0), (OWN_CONFIG, 1)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("positional_table",),
)
def pe_exact_values(subject: Subject, config_seed: tuple[Overrides, int]) -> tuple[float, str]:
    """PE[p, 2i] = sin(p / 10000^(2i/d_model)) and PE[p, 2i+1] = cos(...), interleaved, from p = 0 (paper, section 3.5)."""
    config, seed = config_seed
    pe = judged_table(subject, config)
    positions, d_model = pe.shape
    gen = torch.Generator().manual_seed(seed)
    p = torch.cat([torch.arange(2), torch.randint(0, positions, (62,), generator=gen)]).double()
    values, expected = pe[p.long()], interleaved(p, d_model)
    error = (values - expected).abs().max().item()
    return error, layout_note(values, expected) if error > tol.PE_VALUES.value else ""


def has_positions(subject: Subject) -> str | None:
    return "config pe='none': the model is built without positional encoding" if subject.config.pe == "none" else None


@invariant(
    POSITIONAL,
    tol.POSITIONS,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    applicable=has_positions,
)
def positions_distinguished(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """One token repeated gives different encoder outputs and different logits at every position: positional encodings are added to both stacks' inputs (paper, section 3.5)."""
    config, seed = case
    model = subject.model(config).eval()
    token = tokens(model.config, (1, 1), torch.Generator().manual_seed(seed))
    repeated = token.expand(1, min(REPEATS, model.config.max_len))
    pad = torch.zeros_like(repeated, dtype=torch.bool)
    memory = model.encode(repeated, pad)
    logits = model.decode(repeated, memory, pad, pad)
    encoder, decoder = distinctness(memory[0]), distinctness(logits[0])
    alike = [
        name for name, d in (("encoder outputs", encoder), ("decoder logits", decoder)) if not d >= tol.POSITIONS.value
    ]
    return min(encoder, decoder), (
        f"{' and '.join(alike)} repeat at two positions: no positional encoding is added "
        f"to that stack's input, or its output has lost its input"
        if alike
        else ""
    )


@invariant(
    POSITIONAL,
    tol.AGREEMENT[torch.float64],
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    applicable=has_positions,
    needs=("positional_table", "positional_switch", "source_embeddings", "target_embeddings"),
)
def pe_unit_scale(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """Encoding embeddings x with positions on equals encoding x + the reported PE table with positions off (decoding too, where the table is sinusoidal): PE is added at unit scale, E sqrt(d_model) + PE, not scaled with the embeddings (paper, sections 3.4 and 3.5).

    The decoder is judged against the same table only where it is the paper's sinusoids, which section 3.5 adds to both
    stacks; a learned table (BART learns one per stack) is reported for the encoder alone.
    """
    config, seed = case
    model = subject.model(config).eval()
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    S, T = min(REPEATS, cfg.max_len), min(REPEATS - 2, cfg.max_len)
    x, y = (torch.randn(2, n, cfg.d_model, generator=gen, dtype=torch.float64) for n in (S, T))
    pe = model.positional_table(max(S, T)).detach().to(torch.float64)
    src_pad, tgt_pad = torch.zeros(2, S, dtype=torch.bool), torch.zeros(2, T, dtype=torch.bool)
    memory = model.encode(x, src_pad)
    with model.positional_encoding(False):
        errors = {"encoder outputs": relative_error(model.encode(x + pe[:S], src_pad), memory)}
    sinusoidal = column_residual(table(subject, config)) <= SINUSOID_COLUMNS
    if sinusoidal:
        logits = model.decode(y, memory, src_pad, tgt_pad)
        with model.positional_encoding(False):
            errors["decoder logits"] = relative_error(model.decode(y + pe[:T], memory, src_pad, tgt_pad), logits)
    off = [name for name, error in errors.items() if tol.AGREEMENT[torch.float64].violated(error)]
    notes = (
        [f"{' and '.join(off)} differ: the positions enter at another scale than the table's (E sqrt(d_model) + PE)"]
        if off
        else []
    )
    if not sinusoidal:
        notes.append("decoder not judged: the table is not sinusoidal, and the decoder may learn its own")
    return max(errors.values()), "; ".join(notes)
