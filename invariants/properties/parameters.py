"""Parameter counts against the paper's Table 3, and the shared embedding really shared.

Counts are taken on models built on the meta device (shapes only), at the Table 3 configs appended to
the spec as overrides, so the check applies to any adapter. Rows the adapter cannot build (torch.nn
needs h * d_k == d_model, so rows B1, B2) are named in the reason, not counted.
"""

from __future__ import annotations

import torch

from invariants import tolerances as tol
from invariants.engine import NotApplicable, invariant
from invariants.groups import PARAMETERS
from invariants.subject import Subject
from model import count_parameters
from model.config import TransformerConfig
from model.registry import SpecError
from model.table3 import implied_vocab_size, table3_rows

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


def no_case(_: object) -> str:
    """A parameter count has one fixed case: nothing to say about it in a failure."""
    return ""


@invariant(PARAMETERS, tol.PARAMS, pinned=lambda s: [None], describe=no_case)
def params_base(subject: Subject, _: None) -> float:
    """The base config with the ~37000-token vocabulary has 65M parameters, within 5% (paper, Table 3 and section 5.1)."""
    return abs(counted(subject, TransformerConfig(vocab_size=37000)) / PAPER_BASE - 1)


def rows_with_params() -> list:
    return [row for row in table3_rows() if row.paper_params_millions is not None]


@invariant(PARAMETERS, tol.PARAMS, pinned=lambda s: [rows_with_params()], describe=no_case)
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
    PARAMETERS,
    tol.COUNT,
    pinned=lambda s: [None],
    applicable=lambda s: None if s.config.share_embeddings else "config share_embeddings=false: nothing to tie",
    describe=no_case,
)
def params_tied_embeddings(subject: Subject, _: None) -> tuple[float, str]:
    """Source embedding, target embedding and pre-softmax linear are one tensor when the config shares them (paper, section 3.4).

    Measured as the number of distinct storages beyond the first among the three matrices; the note names which
    matrices hold a storage of their own.
    """
    weights = subject.model().embedding_weights()
    storages: dict[int, list[str]] = {}
    for name, w in weights.items():
        storages.setdefault(w.untyped_storage().data_ptr(), []).append(name)
    apart = [" and ".join(names) for names in storages.values()]
    return len(storages) - 1, (f"not one tensor: {'; '.join(apart)} each hold their own" if len(apart) > 1 else "")


# tied_embeddings_in_use runs at a small config: how a model ties its matrices does not depend on their size, and an
# optimiser step on the 65M model costs seconds
TIED_CONFIG = {"N": 1, "d_model": 32, "h": 4, "d_k": 8, "d_v": 8, "d_ff": 128, "vocab_size": 50, "max_len": 16}


def moved(model, run, weight: torch.Tensor, row: int) -> float:
    """How far run()'s output moves, relative to its size, when `row` of `weight` is nudged in place (then restored)."""
    before = run()
    with torch.no_grad():
        weight[row] += 1.0
        after = run()
        weight[row] -= 1.0
    return (after - before).abs().max().item() / max(1.0, before.abs().max().item())


@invariant(
    PARAMETERS,
    tol.COUNT,
    pinned=lambda s: [0],
    applicable=lambda s: None if s.config.share_embeddings else "config share_embeddings=false: nothing to tie",
    describe=no_case,
)
def tied_embeddings_in_use(subject: Subject, seed: int) -> tuple[float, str]:
    """After .double() and one optimiser step, the matrices embedding_weights() names are one tensor and the ones the model reads: a row nudged in each moves the encoder, the decoder's input and the logits (paper, section 3.4).

    A model "tied" by copying one matrix's values into the others holds three parameters that agree at
    initialisation and drift apart with training; an adapter that names one of them three times hides that from
    params_tied_embeddings. Here a token absent from the batch is nudged in the pre-softmax matrix (only its logit may
    move), and a source and a target token in the embeddings; a matrix the model does not read moves nothing.
    Measured as the number of matrices that are not one tensor or not read.
    """
    model = subject.fresh(TIED_CONFIG).eval()
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    src, tgt = (torch.randint(0, cfg.vocab_size // 2, (2, 5), generator=gen) for _ in range(2))
    src, tgt = src + (src >= cfg.pad_id).long(), tgt + (tgt >= cfg.pad_id).long()  # never pad_id
    pad = torch.zeros(2, 5, dtype=torch.bool)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.enable_grad():
        model.loss(model(src, tgt, pad, pad), tgt).backward()
    optimiser.step()
    weights = model.embedding_weights()
    absent = next(t for t in range(cfg.vocab_size - 1, -1, -1) if t != cfg.pad_id and not (tgt == t).any())
    reads = {
        "source": moved(model, lambda: model.encode(src, pad), weights["source"], int(src[0, 0])),
        "target": moved(model, lambda: model(src, tgt, pad, pad), weights["target"], int(tgt[0, 0])),
        "generator": moved(model, lambda: model(src, tgt, pad, pad)[..., absent], weights["generator"], absent),
    }
    unread = [name for name, effect in reads.items() if effect == 0.0]
    storages = len({w.untyped_storage().data_ptr() for w in weights.values()}) - 1
    notes = (
        [f"the {', '.join(unread)} matrix named by embedding_weights() is not what the model reads"] if unread else []
    )
    if storages:
        notes.append("the three matrices are not one tensor after .double() and an optimiser step")
    return len(unread) + storages, "; ".join(notes)
