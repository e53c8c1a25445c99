"""The decoder cannot see the future, checked three ways, and cached decoding equals the full pass.

Each runs in eval mode and in train mode with dropout active under a fixed seed, with and without
padding, and with and without attention probabilities requested (real leaks in torch and keras
hid on exactly such paths).
"""

from __future__ import annotations


import torch
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import Case, batch_cases, pinned_cases
from invariants.engine import invariant
from invariants.groups import CAUSAL
from invariants.measure import capturing, exact_difference, misshapen, place, worst_row
from invariants.subject import Subject, relative_error, seeded
from model.batch import Batch
from model.protocol import Seq2SeqModel


def future_changed(subject: Subject, case: Case, batch: Batch, j: int) -> Tensor:
    """The target with every non-pad token at positions >= j replaced by a different non-pad token."""
    cfg = subject.model(case.config).config
    gen = torch.Generator().manual_seed(case.seed + 1)
    index = batch.tgt - (batch.tgt > cfg.pad_id).long()  # position among the vocab_size - 1 non-pad ids
    shift = torch.randint(1, cfg.vocab_size - 1, index.shape, generator=gen)
    shifted = (index + shift) % (cfg.vocab_size - 1)
    fresh = shifted + (shifted >= cfg.pad_id).long()
    future = torch.zeros_like(batch.tgt_pad)
    future[:, j:] = True
    return torch.where(future & ~batch.tgt_pad, fresh, batch.tgt)


@invariant(CAUSAL, tol.CAUSAL_FUTURE, pinned=lambda s: pinned_cases(s), cases=lambda s: batch_cases(s, min_tgt=2))
def causal_future_tokens(subject: Subject, case: Case) -> float | tuple[float, str]:
    """Changing the target tokens at positions >= j leaves the logits at positions < j bit-identical (float64) (paper, section 3.2.3)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    j = 1 + case.seed % (case.tgt_len - 1)
    model.train(case.train)
    outputs = []
    for tgt in (batch.tgt, future_changed(subject, case, batch, j)):
        with seeded(case.seed), capturing(model, case.capture):  # the same seed draws the same dropout masks
            outputs.append(model(batch.src, tgt, batch.src_pad, batch.tgt_pad))
    error = exact_difference(outputs[0][:, :j], outputs[1][:, :j])
    if not 0 < error < float("inf"):
        return error
    moved = (outputs[0][:, :j] - outputs[1][:, :j]).abs().amax(-1)  # (B, j)
    b, position = divmod(int(moved.flatten().argmax()), j)
    return error, (
        f"changing the tokens at positions >= {j} moved the logits at position {position} (batch row {b}) by "
        f"{moved[b, position].item():.3g}: the decoder reads later positions there; {where_it_leaks(subject, model, batch)}"
    )


def where_it_leaks(subject: Subject, model: Seq2SeqModel, batch: Batch) -> str:
    """Whether the decoder's captured self-attention weights reach later keys (the mask) or not (then the positions are
    mixed after the softmax, where heads are merged, or outside attention); '' without attention capture."""
    if subject.lacks("attention_probs"):
        return "without attention capture the leak's place is not known"
    was_training = model.training
    try:
        with torch.no_grad(), model.attention_probs() as records:
            model.eval()
            model(batch.src, batch.tgt, batch.src_pad, batch.tgt_pad)
    except Exception:  # noqa: BLE001 - a capture that fails is attention_probs' own finding, not this one's
        return "the attention capture failed, so the leak's place is not known"
    finally:
        model.train(was_training)
    T = batch.tgt.size(1)
    later = torch.ones(T, T, dtype=torch.bool).triu(1) & ~batch.tgt_pad[:, None, None, :]  # (B, 1, T_q, T_k)
    for r in records:
        if r.kind != "decoder_self" or tuple(r.probs.shape[-2:]) != (T, T) or r.probs.size(0) != batch.tgt.size(0):
            continue
        weight = r.probs.double().masked_fill(~later | batch.tgt_pad[:, None, :, None], 0.0)  # real queries only
        if weight.max() > 0:
            b, head, query, key = (int(i) for i in torch.unravel_index(weight.argmax(), weight.shape))
            return (
                f"{place(r, b, head, query)} gives the later key {key} weight {weight.max().item():.3g}: the causal "
                "mask lets it see the future"
            )
    return (
        "the decoder self-attention's captured weights on later keys are all 0, so the leak comes after the softmax: "
        "positions mixed where heads are split or merged (a reshape where a transpose belongs), or outside attention"
    )


@invariant(
    CAUSAL,
    tol.EXACT,
    pinned=lambda s: pinned_cases(s),
    cases=lambda s: batch_cases(s, min_tgt=2),
    needs=("target_embeddings",),
)
def causal_jacobian(subject: Subject, case: Case) -> float | tuple[float, str]:
    """The float64 gradient of the logits at positions < j with respect to the target embeddings at >= j is exactly 0 (paper, section 3.2.3).

    Measured as a vector-Jacobian product with a random cotangent on the logits before j: zero iff the
    Jacobian block is zero (a nonzero block gives a nonzero product with probability 1).
    """
    model, batch = subject.model(case.config), case.make_batch(subject)
    j = 1 + case.seed % (case.tgt_len - 1)
    model.train(case.train)
    with torch.enable_grad(), seeded(case.seed), capturing(model, case.capture):
        memory = model.encode(batch.src, batch.src_pad).detach()
        x = model.embed(batch.tgt).detach().requires_grad_(True)
        logits = model.decode(x, memory, batch.src_pad, batch.tgt_pad)[:, :j]
        if not torch.isfinite(logits).all():
            return float("inf")
        cotangent = torch.randn(logits.shape, generator=torch.Generator().manual_seed(case.seed), dtype=logits.dtype)
        (grad,) = torch.autograd.grad((logits * cotangent).sum(), x, allow_unused=True)
    error = 0.0 if grad is None else grad[:, j:].abs().max().item()  # None: no path from the embeddings, so no leak
    if error == 0:
        return error
    return (
        error,
        f"the logits before position {j} depend on the embeddings from {j} on; {where_it_leaks(subject, model, batch)}",
    )


@invariant(
    CAUSAL,
    tol.EXACT,
    pinned=lambda s: pinned_cases(s, capture=(True,)),
    cases=lambda s: batch_cases(s, capture=True, min_tgt=2),
    needs=("attention_probs",),
)
def causal_future_probs(subject: Subject, case: Case) -> float | tuple[float, str]:
    """Captured decoder self-attention probabilities of non-pad queries on future positions are exactly 0 (paper, section 3.2.3).

    Rows of padded queries are left out: nothing reads their outputs, so what a model puts there is its own affair.
    """
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.train(case.train)
    with seeded(case.seed), model.attention_probs() as records:
        batch.forward(model)
    selfs = [r for r in records if r.kind == "decoder_self"]
    if not selfs:
        raise ValueError("attention_probs() captured no decoder_self records")
    wrong = misshapen([r for r in records if r.kind == "decoder_self"], batch)
    if wrong:
        return float("inf"), wrong
    T = case.tgt_len
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1) & ~batch.tgt_pad[:, None, :, None]  # (B, 1, T, T)
    if not future.any():
        return 0.0
    worst, where = 0.0, ""
    for record in selfs:
        leaked = record.probs.masked_fill(~future, 0.0).double().abs().nan_to_num(float("inf"), float("inf"))
        error, (b, head, query) = worst_row(leaked.amax(-1))
        if error > worst:
            key = int(leaked[b, head, query].argmax())
            worst, where = error, f"worst: {place(record, b, head, query)} puts {error:.3g} on future position {key}"
    return (worst, where) if worst > 0 else worst


@invariant(
    CAUSAL,
    tol.AGREEMENT[torch.float64],
    pinned=lambda s: pinned_cases(s, train=(False,), tgt_len=5),
    cases=lambda s: batch_cases(s, train=False),
    needs=("kv_cache",),
)
def cached_decoding(subject: Subject, case: Case) -> float:
    """Incremental decoding with the KV cache, in random chunks, gives the logits of one full forward pass (user-observable)."""
    model, batch = subject.model(case.config), case.make_batch(subject)
    model.eval()
    no_pad = torch.zeros_like(batch.tgt_pad)  # the cache assumes right padding: target rows are full here
    with capturing(model, case.capture):
        memory = model.encode(batch.src, batch.src_pad)
        full = model.decode(batch.tgt, memory, batch.src_pad, no_pad)
        cache, steps, t = model.new_cache(), [], 0
        gen = torch.Generator().manual_seed(case.seed)
        while t < case.tgt_len:
            n = int(torch.randint(1, case.tgt_len - t + 1, (1,), generator=gen))
            steps.append(model.decode(batch.tgt[:, t : t + n], memory, batch.src_pad, no_pad[:, t : t + n], cache))
            t += n
    return relative_error(torch.cat(steps, dim=1), full)
