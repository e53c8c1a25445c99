"""Invariant 7, continued: where dropout acts (section 5.4): "to the output of each sub-layer, before it is added to the
sub-layer input and normalized", and "to the sums of the embeddings and the positional encodings in both the encoder
and decoder stacks". Nowhere else does the paper put it; both checks count dropout masks, from both sides.

Both feed inputs along a few coordinates (residual_dropout huge ones, beside which the positional encoding does not
matter; dropout_every_sublayer with the encoding switched off) and count the share of outputs that train mode leaves
as in eval: an output is as in eval only when every dropout mask on its path spared the coordinates that carry it. The masks are independent, so the share is a product over the dropout sites on
the path, and it is judged two-sided in binomial standard deviations: a missing site fails as surely as an extra one.

`residual_dropout` zeroes every sub-layer (weights and biases, normalisations kept): each outputs exactly 0, so dropout
on its output changes nothing, and in train mode only the embeddings' dropout acts. Inputs are two-hot,
s * (e_j - e_k): kept on both coordinates (probability (1 - p)^2) the output is the eval output (a LayerNorm maps
such a vector to itself up to scale), otherwise it is not. A stack with no embedding dropout leaves every output as
in eval; one that drops the residual stream (after the sum, or after the LayerNorm) draws another mask at every
sub-layer, and the share falls to (1 - p)^(2 (1 + sub-layers)).

`dropout_every_sublayer` counts the sub-layers' dropouts. Let u = e_0 + e_1 - e_2 - e_3. Every weight matrix of the
encoder and decoder gets the rank-one pattern of u (at coordinates 0-3 modulo d_model, on either axis), everything else
there is set to 0 and the normalisations to identity: every sub-layer then maps a stream c u to a positive multiple of
u (attention averages such values, the FFN passes the ReLU'd half of them), adding GROWTH / N of it or less. The
inputs are c u at every position, with the positional encoding switched off, so that every key looks the same. Dropout
on a sub-layer's output is then as in eval when it keeps or drops all four coordinates (probability q = (1 - p)^4 +
p^4: the stream stays along u, whose scale the LayerNorm takes away) and not otherwise; so the share is (1 - p)^4 q^L
over the L sub-layers on the path (2N to an encoder output, 3N to the logits), and the first mask's mark is still
~GROWTH / N / e of the stream at the last sub-layer, far above SAME. Dropout inside a sub-layer, before a linear map
(on attention probabilities as in torch.nn and the Annotated Transformer, or on the FFN's activations), only rescales
the multiple of u, so it leaves the share alone, but for the chance that it silences the whole sub-layer: every query
sees at least 5 keys of equal value (decoder positions from FIRST_JUDGED on), the FFN at least two copies of u's
positive half (d_ff >= 2 d_model). Attention mixes positions, but only multiples of u: a position is as in eval
exactly when its own masks spare it, and positions count as independent samples.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.residual import GROUP, normalisation_parameters, without_sublayer_weights
from invariants.subject import OWN_CONFIG, Overrides, Subject, seeded
from model.protocol import Seq2SeqModel

P_DROP = 0.3  # residual_dropout: both coordinates of a two-hot survive a mask with probability 0.49
SCALE = 1e8  # of the inputs: the positional encoding beside them moves a normalised output by ~1e-8
SAMPLES, LENGTH = 32, 8  # residual_dropout: sequences x positions, 256 independent positions
SAME = 1e-4  # relative difference counted as the eval output: LayerNorm eps shifts a rescaled input by <= 1e-5, a lost coordinate by >= 1e-2
VOCABULARY = (
    1000  # on the spec's own config: the sites do not depend on it, and 37000 logits per position cost most of a pass
)
SITE_P = 0.075  # dropout_every_sublayer runs at P_drop = SITE_P / N: a share of (1-p)^4 q^(3N) ~ 0.3 at every N
ROWS = {
    True: 48,
    False: 384,
}  # dropout_every_sublayer's sequences on the spec's own config (costly at base) / drawn configs
SOURCE_LEN, TARGET_LEN, FIRST_JUDGED = 8, 12, 4  # decoder positions from 4 on see >= 5 keys
# Each sub-layer adds GROWTH / N times the stream (half that for an FFN): small, so that what a mask took at the first
# sub-layer, about GROWTH / 2N of the stream, is still ~GROWTH / 2N / e at the last (1e-2, 100x SAME, at N = 6), not
# drowned by the stream's growth along u, which each LayerNorm then scales down.
GROWTH = 1 / 3


def two_hot(batch: int, length: int, d_model: int, gen: torch.Generator) -> Tensor:
    """(batch, length, d_model) float64 rows SCALE * (e_j - e_k), j != k drawn for each position."""
    j = torch.randint(0, d_model, (batch, length, 1), generator=gen)
    k = (j + torch.randint(1, d_model, (batch, length, 1), generator=gen)) % d_model
    rows = torch.zeros(batch, length, d_model, dtype=torch.float64)
    return rows.scatter_(-1, j, SCALE).scatter_(-1, k, -SCALE)


def as_in_eval(train: Tensor, evaluated: Tensor) -> Tensor:
    """Per position (bool, the shape of train without its last axis): the train-mode output equals the eval output,
    relative to the eval row's size."""
    difference = (train - evaluated).abs().amax(-1) / evaluated.abs().amax(-1).clamp_min(1e-300)
    return difference < SAME


def share_as_in_eval(train: Tensor, evaluated: Tensor) -> float:
    """The share of positions whose train-mode output equals the eval output."""
    return as_in_eval(train, evaluated).double().mean().item()


def deviation(share: float, expected: float, samples: int) -> float:
    """(share - expected) in binomial standard deviations of a share of `samples` independent positions."""
    return (share - expected) / math.sqrt(expected * (1 - expected) / samples)


def judged(shares: list[tuple[str, float, float, int]], why_high: str, why_low: str) -> tuple[float, str]:
    """The largest |deviation| over (name, share, expected, samples), and a note for those beyond the tolerance."""
    deviations = [(name, share, expected, deviation(share, expected, n)) for name, share, expected, n in shares]
    notes = [
        f"{name} {share:.1%} as in eval, expected {expected:.1%} ({z:+.1f} std): {why_high if z > 0 else why_low}"
        for name, share, expected, z in deviations
        if tol.DROPOUT_SITES.violated(abs(z))
    ]
    return max(abs(z) for *_, z in deviations), "; ".join(notes)


def spec_config(subject: Subject, config: Overrides, p: float) -> Overrides:
    """The case's config with P_drop = p, and on the spec's own config a vocabulary of at most VOCABULARY."""
    if config:
        return {**config, "P_drop": p}
    return {"P_drop": p, "vocab_size": min(subject.config.vocab_size, VOCABULARY)}


@invariant(
    GROUP,
    tol.DROPOUT_SITES,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
)
def residual_dropout(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With every sub-layer computing 0, train mode leaves an output as in eval exactly when the embedding dropout spares its input: one mask on the embeddings, none on the residual stream (paper, section 5.4)."""
    config, seed = case
    model = without_sublayer_weights(subject, spec_config(subject, config, P_DROP), biases=True)
    length = min(LENGTH, model.config.max_len)
    inputs = two_hot(SAMPLES, length, model.config.d_model, torch.Generator().manual_seed(seed))
    pad = torch.zeros(SAMPLES, length, dtype=torch.bool)
    memory = model.encode(inputs, pad)
    logits = model.decode(inputs, memory, pad, pad)
    model.train()  # a fresh copy: nothing to restore
    with seeded(seed):
        encoder = share_as_in_eval(model.encode(inputs, pad), memory)
        decoder = share_as_in_eval(model.decode(inputs, memory, pad, pad), logits)
    expected, n = (1 - P_DROP) ** 2, SAMPLES * length
    return judged(
        [("encoder outputs", encoder, expected, n), ("decoder logits", decoder, expected, n)],
        why_high=f"the embeddings' sums are not dropped (at P_drop={P_DROP})",
        why_low="dropout reaches the residual stream, or drops more than P_drop",
    )


def signs(n: int, d_model: int) -> Tensor:
    """(n,) the direction u on an axis of n: +1 at coordinates 0 and 1 modulo d_model, -1 at 2 and 3, 0 elsewhere."""
    index = torch.arange(n) % d_model
    return (index < 2).double() - ((index >= 2) & (index < 4)).double()


def pattern(shape: torch.Size, d_model: int, gain: float) -> Tensor:
    """A weight matrix that maps multiples of u to multiples of u (either axis may be the input):
    gain / 4 s_i s_j / sqrt(copies_i copies_j), s = `signs`, copies = ceil(n / d_model) on an axis of n. Two in a row
    (W^V then W^O; W_1, ReLU, W_2) multiply by gain^2 (gain^2 / 2 through the ReLU) however wide the space between."""

    def axis(n: int) -> Tensor:
        return signs(n, d_model) / math.sqrt(math.ceil(n / d_model))

    return 0.25 * gain * axis(shape[-2])[:, None] * axis(shape[-1])[None, :]


def proportional_sublayers(subject: Subject, config: Overrides) -> Seq2SeqModel:
    """A fresh float64 copy whose sub-layers map a stream along u to a positive multiple of u: every weight matrix of
    the encoder's and decoder's groups set to `pattern`, every other parameter there to 0, normalisations to identity."""
    model = subject.fresh(config).eval()
    groups = model.parameter_groups()
    if not {"encoder", "decoder"} <= set(groups):
        raise NotApplicable(f"parameter_groups() names no encoder and decoder groups (it has {', '.join(groups)})")
    kept = {w.untyped_storage().data_ptr() for w in model.embedding_weights().values()}
    norms = {p.untyped_storage().data_ptr(): name.endswith("bias") for p, name in normalisation_parameters(model)}
    d_model, gain = model.config.d_model, math.sqrt(GROWTH / model.config.N)
    with torch.no_grad():
        for p in [*groups["encoder"], *groups["decoder"]]:
            address = p.untyped_storage().data_ptr()
            if address in norms:
                p.fill_(0.0 if norms[address] else 1.0)
            elif address not in kept:
                p.copy_(pattern(p.shape, d_model, gain).expand_as(p) if p.dim() >= 2 else torch.zeros_like(p))
    return model


def along_u(rows: int, length: int, d_model: int, size: float) -> Tensor:
    """(rows, length, d_model) float64: size * u at every position."""
    return (size * signs(d_model, d_model)).expand(rows, length, d_model).clone()


def wide_enough(config: Overrides) -> bool:
    """u's four coordinates leave others (at d_model = 4, half of u minus its mean is u again), and the FFN holds two
    copies of u's positive half, so that its activations' dropout silences it with probability p^4 at most."""
    return config["d_model"] >= 8 and config["d_ff"] >= 2 * config["d_model"]


def site_shares(p: float, N: int) -> tuple[float, float]:
    """The shares as in eval with one mask on the embeddings and one on each sub-layer's output: encoder, decoder."""
    q = (1 - p) ** 4 + p**4
    return (1 - p) ** 4 * q ** (2 * N), (1 - p) ** 4 * q ** (3 * N)


@invariant(
    GROUP,
    tol.DROPOUT_SITES,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs().filter(wide_enough), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings", "positional_switch"),
)
def dropout_every_sublayer(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With every sub-layer mapping its input to a multiple of one direction u, the share of outputs train mode leaves as in eval is that of one dropout on each sub-layer's output and one on the embeddings, (1-p)^4 ((1-p)^4 + p^4)^(sub-layers) (paper, section 5.4)."""
    config, seed = case
    N = config.get("N", subject.config.N)
    p = SITE_P / N
    model = proportional_sublayers(subject, spec_config(subject, config, p))
    d, rows = model.config.d_model, ROWS[not config]
    source_len, target_len = min(SOURCE_LEN, model.config.max_len), min(TARGET_LEN, model.config.max_len)
    if target_len <= FIRST_JUDGED:
        raise NotApplicable(f"max_len={model.config.max_len}: decoder positions from {FIRST_JUDGED} on are needed")
    if d < 8:
        raise NotApplicable(
            f"d_model={d}: u's four coordinates need others beside them (at d_model 4, half of u minus "
            f"its mean is u again, and a mask that drops half of u would pass as eval)"
        )
    size = math.sqrt(d / 4)  # a LayerNorm'd stream along u; the same at every position, attention is then spread evenly
    memory, source, target = (along_u(rows, n, d, size) for n in (source_len, source_len, target_len))
    src_pad = torch.zeros(rows, source_len, dtype=torch.bool)
    tgt_pad = torch.zeros(rows, target_len, dtype=torch.bool)
    with model.positional_encoding(False):  # every position the same: no key stands out, at any size
        encoded = model.encode(source[:1], src_pad[:1])
        logits = model.decode(target[:1], memory[:1], src_pad[:1], tgt_pad[:1])
        model.train()  # a fresh copy: nothing to restore
        with seeded(seed):
            encoder = as_in_eval(model.encode(source, src_pad), encoded)
            decoder = as_in_eval(model.decode(target, memory, src_pad, tgt_pad), logits)[:, FIRST_JUDGED:]
    expect_encoder, expect_decoder = site_shares(p, model.config.N)
    return judged(
        [
            ("encoder outputs", encoder.double().mean().item(), expect_encoder, encoder.numel()),
            ("decoder logits", decoder.double().mean().item(), expect_decoder, decoder.numel()),
        ],
        why_high=f"fewer dropout masks than one per sub-layer output and one on the embeddings (P_drop={p:.3g})",
        why_low=f"more dropout masks than one per sub-layer output and one on the embeddings (P_drop={p:.3g})",
    )
