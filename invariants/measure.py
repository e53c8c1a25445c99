"""Measurements that several properties share: differences that count NaN and Inf as infinite, where a captured
attention row is in words, and models with their sub-layers' weights zeroed (the residual and dropout checks)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor
from torch.nn import Parameter

from invariants.guard import NotApplicable
from invariants.subject import Overrides, Subject
from model.batch import Batch
from model.protocol import Seq2SeqModel


def capturing(model: Seq2SeqModel, on: bool):
    """The model's attention capture when on, else a no-op yielding an empty list."""
    return model.attention_probs() if on else nullcontext([])


def exact_difference(a: Tensor, b: Tensor) -> float:
    """max |a - b|, or inf when either holds NaN or Inf."""
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return (a - b).abs().max().item() if a.numel() else 0.0


def misshapen(records: list, batch: Batch) -> str:
    """A note naming the captured records whose probabilities are not (B, h, T_q, T_k) for their kind (queries from the
    source in the encoder, from the target in the decoder and cross-attention; keys from the source in the encoder and
    cross-attention, from the target in the decoder), '' when all fit. Such a record has no padded or future keys to
    locate: the checks that read it fail, with this note, rather than raise."""
    B, S, T = batch.src.size(0), batch.src.size(1), batch.tgt.size(1)
    expected = {"encoder_self": (S, S), "decoder_self": (T, T), "cross": (T, S)}
    wrong = []
    for r in records:
        queries_keys = expected.get(r.kind)
        if queries_keys is None:
            wrong.append(f"a record of unknown kind {r.kind!r}")
        elif r.probs.dim() != 4 or r.probs.size(0) != B or tuple(r.probs.shape[-2:]) != queries_keys:
            wrong.append(
                f"{r.kind} layer {r.layer} of shape {tuple(r.probs.shape)} where ({B}, h, {queries_keys[0]}, "
                f"{queries_keys[1]}) is expected"
            )
    if not wrong:
        return ""
    return f"captured probabilities of the wrong shape: {'; '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}"


ATTENTION_NAMES = {  # the three uses of attention of section 3.2.3, in words
    "encoder_self": "encoder self-attention",
    "decoder_self": "decoder self-attention",
    "cross": "encoder-decoder attention",
}


def place(record, b: int, head: int, query: int) -> str:
    """Where a captured row is, in words: the attention kind, layer, head, query position and batch row."""
    kind = ATTENTION_NAMES.get(record.kind, record.kind)
    return f"{kind}, layer {record.layer}, head {head}, query position {query} (batch row {b})"


def worst_row(per_row: Tensor) -> tuple[float, tuple[int, int, int]]:
    """The largest entry of a (B, h, T_q) error and its (batch row, head, query position)."""
    flat = int(per_row.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), per_row.shape))
    return per_row.flatten()[flat].item(), index


def relative_change(a: Tensor, b: Tensor, scale_of: Tensor) -> float:
    """max |a - b| / max |scale_of|: a difference in units of the values' own size; inf for NaN or Inf."""
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    scale = scale_of.abs().max().item()
    difference = (a - b).abs().max().item()
    return difference / scale if scale > 0 else (float("inf") if difference > 0 else 0.0)


def other_tokens(ids: Tensor, pad_id: int, vocab_size: int, gen: torch.Generator) -> Tensor:
    """Every (non-pad) token replaced by a different non-pad token."""
    index = ids - (ids > pad_id).long()  # position among the vocab_size - 1 non-pad ids
    shifted = (index + torch.randint(1, vocab_size - 1, ids.shape, generator=gen)) % (vocab_size - 1)
    return shifted + (shifted >= pad_id).long()


def normalisation_parameters(model: Seq2SeqModel) -> list[tuple[Parameter, str]]:
    """(parameter, its name in its module) of every normalisation: a module whose class name says Norm (LayerNorm,
    RMSNorm, ...) and whose submodules, if any, hold no parameters (a gain kept beside a parameter-free torch LayerNorm,
    as x-transformers does); a block class named PreNormLayer holds sub-layers with weights, and is none."""
    return [
        (p, name)
        for module in model.modules()
        if "norm" in type(module).__name__.lower()
        and not any(True for child in module.children() for _ in child.parameters())
        for name, p in module.named_parameters()
    ]


def without_sublayer_weights(subject: Subject, config: Overrides, biases: bool = False) -> Seq2SeqModel:
    """A fresh float64 copy of the subject with the encoder's and decoder's weight matrices zeroed.

    With biases=True every other parameter of those groups is zeroed too, except the normalisations'
    (`normalisation_parameters`): each sub-layer then computes exactly 0.
    """
    return zero_sublayers(subject.fresh(config).eval(), biases)


def zero_sublayers(model: Seq2SeqModel, biases: bool = False) -> Seq2SeqModel:
    """without_sublayer_weights' zeroing, on the model as it is: called again after a mode switch, which some models
    answer by laying their weights out anew (a per-head layout for inference), so that the weights a check measures
    are the weights it wrote."""
    groups = model.parameter_groups()
    if not {"encoder", "decoder"} <= set(groups):
        raise NotApplicable(f"parameter_groups() names no encoder and decoder groups (it has {', '.join(groups)})")
    kept = {w.untyped_storage().data_ptr() for w in model.embedding_weights().values()}
    norms = {p.untyped_storage().data_ptr() for p, _ in normalisation_parameters(model)}
    with torch.no_grad():
        for p in [*groups["encoder"], *groups["decoder"]]:
            address = p.untyped_storage().data_ptr()
            if (p.dim() >= 2 and address not in kept) or (biases and p.dim() == 1 and address not in norms):
                p.zero_()
    return model
