"""Invariant 5: parameter counts against the paper's Table 3, and the shared embedding really shared.

Counts are taken on models built on the meta device (shapes only), at the Table 3 configs appended to
the spec as overrides, so the check applies to any adapter. Rows the adapter cannot build (torch.nn
needs h * d_k == d_model, so rows B1, B2) are named in the reason, not counted.
"""

from __future__ import annotations

import torch

from invariants import tolerances as tol
from invariants.engine import NotApplicable, invariant
from invariants.subject import Subject
from model import count_parameters
from model.config import TransformerConfig
from model.registry import SpecError
from model.table3 import implied_vocab_size, table3_rows

GROUP = "5 parameters"
PAPER_BASE = 65e6
SIZE_FIELDS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "pe", "vocab_size", "share_embeddings")


def as_overrides(cfg: TransformerConfig) -> dict[str, object]:
    """cfg's fields that set the parameter count."""
    return {name: getattr(cfg, name) for name in SIZE_FIELDS}


def counted(subject: Subject, cfg: TransformerConfig) -> int:
    """Trainable parameters of the subject built at cfg's size fields, a shared tensor counted once."""
    try:
        with torch.device("meta"):
            model = subject.build(as_overrides(cfg))
    except SpecError:
        raise
    except Exception:  # an adapter that cannot be built on meta: build it for real
        model = subject.build(as_overrides(cfg))
    return count_parameters(model.parameter_groups())["total"]


@invariant(GROUP, tol.PARAMS, pinned=lambda s: [None])
def params_base(subject: Subject, _: None) -> float:
    """The base config with the ~37000-token vocabulary has 65M parameters, within 5% (paper, Table 3 and section 5.1)."""
    return abs(counted(subject, TransformerConfig(vocab_size=37000)) / PAPER_BASE - 1)


def rows_with_params() -> list:
    return [row for row in table3_rows() if row.paper_params_millions is not None]


@invariant(GROUP, tol.PARAMS, pinned=lambda s: [rows_with_params()])
def params_table3(subject: Subject, rows: list) -> tuple[float, str]:
    """Each Table 3 row that prints a parameter count is within 5% of it, at the vocabulary the column implies (~41K) (paper, Table 3)."""
    worst, unbuildable = 0.0, []
    for row in rows:
        try:
            n = counted(subject, row.config().replace(vocab_size=implied_vocab_size()))
        except SpecError as exc:  # the adapter refuses this config: say so, do not count it
            unbuildable.append(f"{row.name} ({str(exc).split(': ', 1)[-1]})")
            continue
        worst = max(worst, abs(n / (row.paper_params_millions * 1e6) - 1))
    if len(unbuildable) == len(rows):
        raise NotApplicable("the model builds no Table 3 row: " + "; ".join(unbuildable))
    return worst, ("rows the model cannot build, not counted: " + "; ".join(unbuildable)) if unbuildable else ""


@invariant(
    GROUP,
    tol.COUNT,
    pinned=lambda s: [None],
    applicable=lambda s: None if s.config.share_embeddings else "config share_embeddings=false: nothing to tie",
)
def params_tied_embeddings(subject: Subject, _: None) -> float:
    """Source embedding, target embedding and pre-softmax linear are one tensor when the config shares them (paper, section 3.4).

    Measured as the number of distinct storages beyond the first among the three matrices.
    """
    weights = subject.model().embedding_weights()
    return len({w.untyped_storage().data_ptr() for w in weights.values()}) - 1
