"""What users of such a harness also expect of any Transformer.

Padding and batch mates change nothing, eval is deterministic and dropout really acts in train mode,
the fused and explicit attention paths agree, attention logits are scaled by 1/sqrt(d_k), embeddings
by sqrt(d_model) on every path into the layers, and every trainable parameter receives a gradient.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from hypothesis import strategies as st

from invariants import tolerances as tol
from invariants.cases import Case, batch_cases, pinned_cases
from invariants.engine import invariant
from invariants.groups import BEHAVIOUR
from invariants.measure import capturing, exact_difference, relative_change
from invariants.subject import OWN_CONFIG, Overrides, Subject, random_batch, relative_error, seeded
from model.batch import Batch


def eval_cases(subject: Subject, **fixed):
    return batch_cases(subject, train=False, **fixed)


def eval_pinned(subject: Subject, **fixed):
    return pinned_cases(subject, train=(False,), **fixed)


@invariant(BEHAVIOUR, tol.AGREEMENT[torch.float64], pinned=eval_pinned, cases=eval_cases)
def padding_invariance(subject: Subject, case: Case) -> float:
    """Adding pad tokens to source and target (on the source's padding side) changes no logit at a non-pad position (eval, float64) (user-observable)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    extra = 1 + case.seed % 3
    pad_id = model.config.pad_id

    def grow(ids: torch.Tensor, pad: torch.Tensor, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        more = torch.full((ids.size(0), extra), pad_id), torch.ones(pad.size(0), extra, dtype=torch.bool)
        if side == "left":
            return torch.cat([more[0], ids], 1), torch.cat([more[1], pad], 1)
        return torch.cat([ids, more[0]], 1), torch.cat([pad, more[1]], 1)

    # Pads added on the left move every real token to a later position: with absolute positions (section 3.5) the
    # logits then change in a correct model. So left pads are added with the positional encoding switched off, where
    # positions no longer matter and only the mask keeps the pads out; a model that cannot switch it off gets its
    # left-padded rows grown on the right.
    side = case.side if case.padded else subject.padding_sides[0]
    unplaced = side == "left" and not subject.lacks("positional_switch")
    side = side if unplaced else "right" if "right" in subject.padding_sides else side
    (src, src_pad), (tgt, tgt_pad) = grow(batch.src, batch.src_pad, side), grow(batch.tgt, batch.tgt_pad, "right")
    model.eval()
    with capturing(model, case.capture), model.positional_encoding(False) if unplaced else nullcontext():
        before, after = batch.forward(model), Batch(src, tgt, src_pad, tgt_pad).forward(model)[:, : case.tgt_len]
    keep = ~batch.tgt_pad
    return relative_error(after[keep], before[keep])


@invariant(BEHAVIOUR, tol.AGREEMENT[torch.float64], pinned=eval_pinned, cases=lambda s: eval_cases(s, min_batch=2))
def batch_independence(subject: Subject, case: Case) -> float:
    """An example's logits do not depend on its batch mates: the batch equals each row run alone (eval, float64) (user-observable)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    with capturing(model, case.capture):
        together = batch.forward(model)
        alone = torch.cat(
            [
                Batch(
                    batch.src[b : b + 1], batch.tgt[b : b + 1], batch.src_pad[b : b + 1], batch.tgt_pad[b : b + 1]
                ).forward(model)
                for b in range(case.batch)
            ]
        )
    keep = ~batch.tgt_pad  # logits at pad positions are read by nothing
    return relative_error(together[keep], alone[keep])


@invariant(BEHAVIOUR, tol.DETERMINISM, pinned=eval_pinned, cases=eval_cases)
def eval_determinism(subject: Subject, case: Case) -> float:
    """In eval mode two passes under different random seeds give identical logits (user-observable)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    outputs = []
    for seed in (case.seed, case.seed + 1):
        with seeded(seed), capturing(model, case.capture):
            outputs.append(batch.forward(model))
    return exact_difference(*outputs)


def has_dropout(subject: Subject) -> str | None:
    return (
        None if subject.config.P_drop > 0 else f"config P_drop={subject.config.P_drop}: there is no dropout to observe"
    )


@invariant(
    BEHAVIOUR,
    tol.DROPOUT,
    pinned=lambda s: pinned_cases(s, train=(True,), capture=(False,)),
    cases=lambda s: batch_cases(s, train=True, capture=False, min_src=4, min_tgt=4),
    applicable=has_dropout,
)
def dropout_active(subject: Subject, case: Case) -> float:
    """In train mode dropout acts: logits differ between seeds and from eval mode (paper, section 5.4).

    Four train passes under different seeds, measured relative to the logits' own magnitude (max |eval logits|,
    no floor: a freshly initialised model's logits may be ~0.1): the larger difference between seeds and the larger
    difference from eval, the smaller of the two. At d_model=4 one mask may change a logit by only 1e-4 of its size,
    so the bound sits just above float64 noise, not at an effect size (tolerances.DROPOUT).
    """
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.train()
    runs = []
    for seed in range(case.seed, case.seed + 4):
        with seeded(seed):
            runs.append(batch.forward(model))
    model.eval()
    evaluated = batch.forward(model)
    between_seeds = max(relative_change(runs[0], run, evaluated) for run in runs[1:])
    from_eval = max(relative_change(run, evaluated, evaluated) for run in runs)
    return min(between_seeds, from_eval)


@invariant(
    BEHAVIOUR,
    tol.AGREEMENT[torch.float64],
    pinned=lambda s: eval_pinned(s, capture=(False,)),
    cases=lambda s: eval_cases(s, capture=False),
    needs=("attention_probs",),
)
def fast_equals_explicit(subject: Subject, case: Case) -> float:
    """The fast attention path (no probabilities requested) gives the logits of the explicit path (probabilities captured) (user-observable)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    fast = batch.forward(model)
    with model.attention_probs():
        explicit = batch.forward(model)
    return relative_error(fast, explicit)


INFORMATIVE = 1e-250  # float64 probabilities above this have an exact, finite log; exp underflows near 1e-308
KINDS = ("encoder_self", "decoder_self", "cross")  # every attention eq. (1) scales: section 3.2.3's three uses
ROWS = 8  # sentences of 16 source and 16 target tokens: each spread is a mean over >= 120 query rows


def logit_spreads(subject: Subject, config: Overrides, seed: int) -> dict[str, float]:
    """Per kind of attention, the mean over query rows of the std of its logits, recovered from the probabilities
    captured in the last layer of that kind.

    log p_j = s_j - logsumexp(s) recovers the logits up to a row constant, but only where p_j > 0: a saturated
    softmax underflows some p_j to 0, and the causal mask zeroes the future. So the std is taken over each row's
    informative entries (p_j > 1e-250), in rows with at least two of them. The last layer's inputs, queries and
    memory alike, have been through a LayerNorm, so their scale does not depend on how the model scales its embeddings.
    """
    model = subject.model(config)
    batch = random_batch(model.config, ROWS, 16, 16, False, seed)
    model.eval()
    with model.attention_probs() as records:
        batch.forward(model)
    spreads = {}
    for kind in KINDS:
        last = max(r.layer for r in records if r.kind == kind)
        probs = next(r.probs for r in records if r.kind == kind and r.layer == last).double()
        informative = probs > INFORMATIVE
        log_p = probs.clamp_min(INFORMATIVE).log()
        n = informative.sum(-1)
        mean = (log_p * informative).sum(-1) / n.clamp_min(1)
        var = (((log_p - mean[..., None]) ** 2) * informative).sum(-1) / (n - 1).clamp_min(1)
        rows = n >= 2
        spreads[kind] = var[rows].sqrt().mean().item() if rows.any() else float("nan")
    return spreads


@invariant(
    BEHAVIOUR,
    tol.SCALING,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(
        st.sampled_from([64, 128]).map(lambda d: {"d_model": d, "d_ff": 64, "max_len": 128}), st.integers(0, 2**16)
    ),
    needs=("attention_probs",),
)
def attention_scaling(subject: Subject, config_seed: tuple[Overrides, int]) -> tuple[float, str]:
    """Encoder self-, decoder self- and cross-attention logits are each scaled by 1/sqrt(d_k): at init their spread is the same for d_k=d_model and d_k=4 (paper, sections 3.2.1 and 3.2.3).

    Both configs project to h * d_k = d_model, so q and k have entries of the same size and q.k grows like
    sqrt(d_k); divided by sqrt(d_k) the spreads agree. Any other constant (none, 1/d_k, 1/sqrt(d_model)) makes
    them differ by a factor sqrt(d_model/4) (>= 4 at the drawn d_model of 64 and 128, 11 at the base 512). Measured as
    |log2| of the ratio, for each kind of attention apart: eq. (1) holds for every one of them.
    """
    config, seed = config_seed
    d = config.get("d_model", subject.config.d_model)
    common = {**config, "N": 2, "vocab_size": 100}
    wide = logit_spreads(subject, {**common, "h": 1, "d_k": d, "d_v": d}, seed)
    narrow = logit_spreads(subject, {**common, "h": d // 4, "d_k": 4, "d_v": 4}, seed)
    off = {}
    for kind in KINDS:
        ratio = wide[kind] / narrow[kind]
        off[kind] = abs(math.log2(ratio)) if math.isfinite(ratio) and ratio > 0 else float("inf")
    unscaled = [f"{kind} ({off[kind]:.2f})" for kind in KINDS if tol.SCALING.violated(off[kind])]
    return max(off.values()), (
        f"the spread of {', '.join(unscaled)} changes with d_k (|log2| of the ratio): not divided by sqrt(d_k)"
        if unscaled
        else ""
    )


@invariant(
    BEHAVIOUR,
    tol.AGREEMENT[torch.float64],
    pinned=eval_pinned,
    cases=eval_cases,
    needs=("source_embeddings", "target_embeddings"),
)
def embedding_scaling(subject: Subject, case: Case) -> float:
    """Token embeddings enter both stacks multiplied by sqrt(d_model) (paper, section 3.4): embed(ids), encode and decode agree.

    embed(ids) = sqrt(d_model) * E_target[ids]; encoding sqrt(d_model) * E_source[src] equals encoding src; and
    decoding sqrt(d_model) * E_target[tgt] equals decoding tgt. A model that scales in embed() but not on the
    encoder's or decoder's own path fails the second or third.
    """
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    weights, root_d = model.embedding_weights(), math.sqrt(model.config.d_model)
    source, target = (weights[side][ids].cpu() * root_d for side, ids in (("source", batch.src), ("target", batch.tgt)))
    scaled = relative_error(model.embed(batch.tgt), target)
    with capturing(model, case.capture):
        memory = model.encode(batch.src, batch.src_pad)
        encoder_path = relative_error(model.encode(source, batch.src_pad)[~batch.src_pad], memory[~batch.src_pad])
        via_ids = model.decode(batch.tgt, memory, batch.src_pad, batch.tgt_pad)
        via_embeddings = model.decode(target, memory, batch.src_pad, batch.tgt_pad)
    keep = ~batch.tgt_pad
    return max(scaled, encoder_path, relative_error(via_embeddings[keep], via_ids[keep]))


@invariant(
    BEHAVIOUR,
    tol.COUNT,
    pinned=lambda s: pinned_cases(s, train=(True,), capture=(False,))[:1],
    cases=lambda s: batch_cases(s, train=True, capture=False),
)
def gradients_reach_all(subject: Subject, case: Case) -> tuple[float, str]:
    """Every trainable parameter receives a finite gradient from the loss (train mode): counted, the offenders named (user-observable)."""
    model, batch = subject.model(case.config, torch.float32), case.make_batch(subject)
    model.train()
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with torch.enable_grad(), seeded(case.seed):
        loss = model.loss(batch.forward(model), batch.tgt)
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    offenders = [name for (name, _), g in zip(named, grads) if g is None or not torch.isfinite(g).all()]
    return len(offenders), (
        "no or non-finite gradient: " + ", ".join(offenders[:5]) + (" ..." if len(offenders) > 5 else "")
    ) if offenders else ""
