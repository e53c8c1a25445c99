"""The label-smoothed loss of section 5.4.

The loss checks call the model's own `loss` (built with the eps_ls under test) on synthetic logits in
float64, so they are cheap and use small configs. The learning-rate schedule of eq. (3) belongs to the
harness, not the model (the ablation runner trains every model with `model.objective.learning_rate`),
so it is checked by the harness's own tests (tests/invariants/test_verdicts.py), not reported as a model's verdict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import invariant
from invariants.groups import LOSS
from invariants.subject import Overrides, Subject, relative_error, right_padding
from model.protocol import Seq2SeqModel

PINNED_CONFIG = {"N": 1, "d_model": 8, "h": 2, "d_k": 4, "d_v": 4, "d_ff": 16, "vocab_size": 50, "max_len": 128}
EXTREME = 1e4  # logits this large underflow exp() in a naive log(softmax(.)), even in float64


def logits_and_target(vocab: int, seed: int, scale: float = 1.0, padded: bool = True) -> tuple[Tensor, Tensor]:
    """Random float64 logits (3, 5, vocab) times scale and a target with ragged right padding (pad_id 0)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, vocab, generator=gen, dtype=torch.float64) * scale
    target = torch.randint(1, vocab, (3, 5), generator=gen)
    return logits, target.masked_fill(right_padding(3, 5, padded, gen), 0)


def model_at(subject: Subject, config: Overrides, eps: float) -> Seq2SeqModel:
    """The subject at a small config with label smoothing eps (pad_id 0, as the synthetic targets use)."""
    return subject.model({**config, "eps_ls": eps, "pad_id": 0})


@invariant(
    LOSS,
    tol.AGREEMENT[torch.float64],
    pinned=lambda s: [(PINNED_CONFIG, 0, 1.0), (PINNED_CONFIG, 1, EXTREME)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16), st.sampled_from([1.0, 100.0, EXTREME])),
    precision="loss",
)
def loss_eps_zero_is_nll(subject: Subject, case: tuple[Overrides, int, float]) -> float:
    """With eps_ls=0 the loss is the NLL averaged over non-pad tokens, finite also at logits of 1e4 (paper, section 5.4; user-observable finiteness)."""
    config, seed, scale = case
    model = model_at(subject, config, 0.0)
    logits, target = logits_and_target(model.config.vocab_size, seed, scale)
    nll = F.nll_loss(torch.log_softmax(logits, -1).flatten(0, 1), target.flatten(), ignore_index=0)
    return relative_error(model.loss(logits, target), nll)


def smoothed_targets(target: Tensor, vocab: int, eps: float, pad_id: int) -> dict[str, Tensor]:
    """The label-smoothed distributions in use, each 1 - eps on the true token (give or take eps / V) and eps spread.

    Szegedy et al. (2016), whom the paper cites, and torch's cross_entropy add eps / V to every token; fairseq gives
    each other token eps / (V - 1); the Annotated Transformer and OpenNMT give eps / (V - 2) to every token but the
    true one and padding. The paper does not choose: any of them is its label smoothing.
    """
    one_hot = F.one_hot(target, vocab).double()
    others = (1 - one_hot).clone()
    others[..., pad_id] = 0
    return {
        "eps/V to every token": one_hot * (1 - eps) + eps / vocab,
        "eps/(V-1) to every other token": one_hot * (1 - eps) + (1 - one_hot) * eps / (vocab - 1),
        "eps/(V-2) to every other token but padding": one_hot * (1 - eps) + others * eps / (vocab - 2),
    }


@invariant(
    LOSS,
    tol.ANALYTIC,
    pinned=lambda s: [(PINNED_CONFIG, 0, 0.1)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16), st.floats(0.01, 0.5).map(lambda e: round(e, 3))),
    precision="loss",
)
def loss_smoothed_minimum(subject: Subject, case: tuple[Overrides, int, float]) -> tuple[float, str]:
    """The loss is minimal where softmax(logits) is a label-smoothed target with the config's eps: zero gradient there (paper, section 5.4)."""
    config, seed, eps = case
    model = model_at(subject, config, eps)
    vocab = model.config.vocab_size
    _, target = logits_and_target(vocab, seed, padded=False)
    gradients = {}
    for name, q in smoothed_targets(target, vocab, eps, pad_id=0).items():
        with torch.enable_grad():
            logits = q.clamp_min(1e-30).log().requires_grad_(True)  # a token with no mass: softmax ~1e-30, not -inf
            (grad,) = torch.autograd.grad(model.loss(logits, target), logits)
        gradients[name] = grad.abs().max().item() * target.numel()
    best = min(gradients, key=gradients.get)
    return gradients[best], f"minimum at the target with {best}"


@invariant(
    LOSS,
    tol.AGREEMENT[torch.float64],
    pinned=lambda s: [(PINNED_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    precision="loss",
)
def loss_pad_normalisation(subject: Subject, case: tuple[Overrides, int]) -> float:
    """The loss is averaged over non-pad target tokens: appending padded positions (any logits) changes nothing (user-observable)."""
    config, seed = case
    model = model_at(subject, config, model_eps(subject))
    logits, target = logits_and_target(model.config.vocab_size, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    extra = 1 + seed % 4
    more_logits = torch.cat([logits, torch.randn(3, extra, logits.size(-1), generator=gen, dtype=logits.dtype)], 1)
    more_target = torch.cat([target, torch.zeros(3, extra, dtype=target.dtype)], 1)
    return relative_error(model.loss(more_logits, more_target), model.loss(logits, target))


def model_eps(subject: Subject) -> float:
    """The spec's label smoothing, or the paper's 0.1 when the spec switches it off (padding matters either way)."""
    return subject.config.eps_ls or 0.1
