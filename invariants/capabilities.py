"""What a check needs of a model beyond ids in and logits out, and how the suite finds out whether the model has it.

A model may declare a capability missing (`model.unsupported`, the names in model.protocol.CAPABILITIES), and the
checks that need it are then not applicable, with its reason. Adapters often lack one without saying so: written
before `encode` had to take float embeddings, their encode looks its input up in an embedding table and raises on
floats; an attention_probs that was never written raises NotImplementedError. So before a check that needs a
capability runs, the capability is tried once on the spec's own model with a batch of one short sentence: if that
call raises, the check is not applicable, and the reason names the member, what it raised and what to add. A check
that raises on a model whose probe went through stays an error: that is a check broken on a model that has what it
needs, never a missing capability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from invariants.guard import harness_stop
from model.batch import Batch
from model.protocol import Seq2SeqModel

GUIDE = "docs/plugging-in.md, adapter writers' reference"


@dataclass(frozen=True)
class Probe:
    """How to try one capability: the member it exercises, what an adapter must add for it, and the call."""

    member: str  # as the reason names it, e.g. "encode(float source embeddings)"
    advice: str  # what to implement, in a few words
    attempt: Callable[[Seq2SeqModel, Batch], object]  # raises when the model lacks the capability


def _source_embeddings(model: Seq2SeqModel, batch: Batch) -> object:
    embedded = torch.randn(*batch.src.shape, model.config.d_model, dtype=_dtype(model))
    return model.encode(embedded, batch.src_pad)


def _target_embeddings(model: Seq2SeqModel, batch: Batch) -> object:
    memory = model.encode(batch.src, batch.src_pad)
    return model.decode(model.embed(batch.tgt), memory, batch.src_pad, batch.tgt_pad)


def _attention_probs(model: Seq2SeqModel, batch: Batch) -> object:
    with model.attention_probs() as records:
        batch.forward(model)
    if not records:
        raise ValueError("nothing was recorded during a forward pass")
    return records


def _kv_cache(model: Seq2SeqModel, batch: Batch) -> object:
    memory = model.encode(batch.src, batch.src_pad)
    return model.decode(batch.tgt[:, :1], memory, batch.src_pad, batch.tgt_pad[:, :1], model.new_cache())


def _positional_switch(model: Seq2SeqModel, batch: Batch) -> object:
    with model.positional_encoding(False):
        return batch.forward(model)


def _dtype(model: Seq2SeqModel) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float64)


PROBES: dict[str, Probe] = {
    "source_embeddings": Probe(
        "encode(float source embeddings)",
        "let encode take (B, S, d_model) float source embeddings, already scaled by sqrt(d_model), and add the "
        "positions to them as to the ids' embeddings",
        _source_embeddings,
    ),
    "target_embeddings": Probe(
        "decode(float target embeddings)",
        "let decode take (B, T, d_model) float target embeddings as embed() returns them, positions added there",
        _target_embeddings,
    ),
    "attention_probs": Probe(
        "attention_probs()",
        "a context manager yielding a list to which every attention call appends AttentionRecord(kind, layer, probs)",
        _attention_probs,
    ),
    "kv_cache": Probe(
        "new_cache() and decode(..., cache)",
        "return a model.cache.KVCache subclass from new_cache() and decode only the new positions with it",
        _kv_cache,
    ),
    "positional_table": Probe(
        "positional_table(positions)",
        "return the (positions, d_model) encoding added at positions 0 ..",
        lambda model, batch: model.positional_table(2),
    ),
    "positional_switch": Probe(
        "positional_encoding(False)",
        "a context manager that switches the positional encoding off in both stacks",
        _positional_switch,
    ),
}


def tiny_batch(model: Seq2SeqModel) -> Batch:
    """One sentence: 3 source and 2 target tokens, none of them padding."""
    cfg = model.config
    token = 1 if cfg.pad_id != 1 else 2
    src = torch.full((1, 3), token % cfg.vocab_size)
    tgt = torch.full((1, 2), token % cfg.vocab_size)
    return Batch(src, tgt, torch.zeros_like(src, dtype=torch.bool), torch.zeros_like(tgt, dtype=torch.bool))


def missing(model: Seq2SeqModel, capability: str) -> str | None:
    """Why the model lacks the capability, found by trying it (None when the call goes through), in eval mode without
    gradients; the model's mode and torch's random state are left as they were."""
    probe = PROBES.get(capability)
    if probe is None:
        return None
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            probe.attempt(model, tiny_batch(model))
    except BaseException as exc:  # any failure of the member itself is the missing capability; the reason quotes it
        if harness_stop(exc):
            raise
        said = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raised = f"{type(exc).__name__}{': ' + said[:160] if said else ''}"
        return f"{probe.member} raised {raised}; to be checked here, {probe.advice} ({GUIDE})"
    finally:
        model.train(training)
    return None
