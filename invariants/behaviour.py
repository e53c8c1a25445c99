"""Invariant 6 (model side): what users of such a harness also expect of any Transformer.

Padding and batch mates change nothing, eval is deterministic and dropout really acts in train mode,
the fused and explicit attention paths agree, attention logits are scaled by 1/sqrt(d_k), embeddings
by sqrt(d_model), and every trainable parameter receives a gradient.
"""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from invariants import tolerances as tol
from invariants.cases import Case, batch_cases, pinned_cases
from invariants.causal import capturing, exact_difference
from invariants.engine import invariant
from invariants.subject import Batch, Subject, make_batch, relative_error, seeded

GROUP = "6 expected behaviour"


def eval_cases(subject: Subject, **fixed):
    return batch_cases(subject, train=False, **fixed)


def eval_pinned(subject: Subject, **fixed):
    return pinned_cases(subject, train=(False,), **fixed)


@invariant(GROUP, tol.AGREEMENT[torch.float64], pinned=eval_pinned, cases=eval_cases)
def padding_invariance(subject: Subject, case: Case) -> float:
    """Appending pad tokens to source and target changes no logit at a non-pad position (eval, float64)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    extra = 1 + case.seed % 3
    pad_id = model.config.pad_id
    grow = lambda ids, pad: (torch.cat([ids, torch.full((ids.size(0), extra), pad_id)], 1),  # noqa: E731
                             torch.cat([pad, torch.ones(pad.size(0), extra, dtype=torch.bool)], 1))
    (src, src_pad), (tgt, tgt_pad) = grow(batch.src, batch.src_pad), grow(batch.tgt, batch.tgt_pad)
    model.eval()
    with capturing(model, case.capture):
        before, after = batch.forward(model), Batch(src, tgt, src_pad, tgt_pad).forward(model)[:, : case.tgt_len]
    keep = ~batch.tgt_pad
    return relative_error(after[keep], before[keep])


@invariant(GROUP, tol.AGREEMENT[torch.float64], pinned=eval_pinned,
           cases=lambda s: eval_cases(s, min_batch=2))
def batch_independence(subject: Subject, case: Case) -> float:
    """An example's logits do not depend on its batch mates: the batch equals each row run alone (eval, float64)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    with capturing(model, case.capture):
        together = batch.forward(model)
        alone = torch.cat([Batch(batch.src[b:b + 1], batch.tgt[b:b + 1], batch.src_pad[b:b + 1],
                                 batch.tgt_pad[b:b + 1]).forward(model) for b in range(case.batch)])
    keep = ~batch.tgt_pad  # logits at pad positions are read by nothing
    return relative_error(together[keep], alone[keep])


@invariant(GROUP, tol.DETERMINISM, pinned=eval_pinned, cases=eval_cases)
def eval_determinism(subject: Subject, case: Case) -> float:
    """In eval mode two passes under different random seeds give identical logits."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    outputs = []
    for seed in (case.seed, case.seed + 1):
        with seeded(seed), capturing(model, case.capture):
            outputs.append(batch.forward(model))
    return exact_difference(*outputs)


def has_dropout(subject: Subject) -> str | None:
    return None if subject.config.P_drop > 0 else f"config P_drop={subject.config.P_drop}: there is no dropout to observe"


@invariant(GROUP, tol.EFFECT, pinned=lambda s: pinned_cases(s, train=(True,), capture=(False,)),
           cases=lambda s: batch_cases(s, train=True, capture=False, min_src=4, min_tgt=4),
           applicable=has_dropout)
def dropout_active(subject: Subject, case: Case) -> float:
    """In train mode dropout acts: logits differ between two seeds and from eval mode (relative difference, the smaller)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.train()
    runs = []
    for seed in (case.seed, case.seed + 1):
        with seeded(seed):
            runs.append(batch.forward(model))
    model.eval()
    return min(relative_error(runs[0], runs[1]), relative_error(runs[0], batch.forward(model)))


@invariant(GROUP, tol.AGREEMENT[torch.float64], pinned=lambda s: eval_pinned(s, capture=(False,)),
           cases=lambda s: eval_cases(s, capture=False), needs=("attention_probs",))
def fast_equals_explicit(subject: Subject, case: Case) -> float:
    """The fast attention path (no probabilities requested) gives the logits of the explicit path (probabilities captured)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    fast = batch.forward(model)
    with model.attention_probs():
        explicit = batch.forward(model)
    return relative_error(fast, explicit)


def logit_spread(subject: Subject, config: str, seed: int) -> float:
    """Mean over rows of the std of centred log-probabilities, i.e. of the attention logits, in encoder layer 0."""
    model = subject.model(config)
    batch = make_batch(model.config, 4, 16, 2, False, seed)
    model.eval()
    with model.attention_probs() as records:
        model.encode(batch.src, batch.src_pad)
    probs = next(r.probs for r in records if r.kind == "encoder_self" and r.layer == 0)
    log_p = probs.log()  # log p_j = s_j - logsumexp(s): centring removes the row constant
    return (log_p - log_p.mean(-1, keepdim=True)).std(-1).mean().item()


@invariant(GROUP, tol.SCALING, pinned=lambda s: [("", 0)],
           cases=lambda s: st.tuples(st.sampled_from([32, 64]).map(lambda d: f"d_model={d},d_ff=64,max_len=128"),
                                     st.integers(0, 2**16)),
           needs=("attention_probs",))
def attention_scaling(subject: Subject, config_seed: tuple[str, int]) -> float:
    """Attention logits are scaled by 1/sqrt(d_k): their spread at init does not grow with d_k (d_k=d_model vs d_k=4).

    Logits are recovered from captured probabilities (log p, centred per row). With the scaling their spread is
    about the same for both head sizes; without it, it grows by sqrt(d_model/4). Measured as |log2| of the ratio.
    """
    config, seed = config_seed
    d = int(config.split("d_model=")[1].split(",")[0]) if config else subject.config.d_model
    common = f"{config + ',' if config else ''}N=1,vocab_size=100"
    wide = logit_spread(subject, f"{common},h=1,d_k={d},d_v={d}", seed)
    narrow = logit_spread(subject, f"{common},h={d // 4},d_k=4,d_v=4", seed)
    ratio = wide / narrow
    return abs(math.log2(ratio)) if math.isfinite(ratio) and ratio > 0 else float("inf")


@invariant(GROUP, tol.AGREEMENT[torch.float64], pinned=eval_pinned, cases=eval_cases)
def embedding_scaling(subject: Subject, case: Case) -> float:
    """embed(ids) = sqrt(d_model) * E[ids] with E the target embedding, and decoding embed(ids) equals decoding ids."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    weight = model.embedding_weights()["target"]
    scaled = relative_error(model.embed(batch.tgt), weight[batch.tgt] * math.sqrt(model.config.d_model))
    with capturing(model, case.capture):
        memory = model.encode(batch.src, batch.src_pad)
        via_ids = model.decode(batch.tgt, memory, batch.src_pad, batch.tgt_pad)
        via_embeddings = model.decode(model.embed(batch.tgt), memory, batch.src_pad, batch.tgt_pad)
    return max(scaled, relative_error(via_embeddings, via_ids))


@invariant(GROUP, tol.COUNT, pinned=lambda s: pinned_cases(s, train=(True,), capture=(False,))[:1],
           cases=lambda s: batch_cases(s, train=True, capture=False))
def gradients_reach_all(subject: Subject, case: Case) -> tuple[float, str]:
    """Every trainable parameter receives a finite gradient from the loss (train mode): counted, the offenders named."""
    model, batch = subject.model(case.config, torch.float32), case.make_batch(subject)
    model.train()
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with torch.enable_grad(), seeded(case.seed):
        loss = model.loss(batch.forward(model), batch.tgt)
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    offenders = [name for (name, _), g in zip(named, grads) if g is None or not torch.isfinite(g).all()]
    return len(offenders), ("no or non-finite gradient: " + ", ".join(offenders[:5]) + (" ..." if len(offenders) > 5 else "")) if offenders else ""
