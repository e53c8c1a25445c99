"""Where dropout acts (section 5.4): "to the output of each sub-layer, before it is added to the
sub-layer input and normalized", and "to the sums of the embeddings and the positional encodings in both the encoder
and decoder stacks". Nowhere else does the paper put it; both checks count dropout masks, from both sides.

Both count the share of outputs that train mode leaves as a known deterministic computation gives them: an output is
that only when every dropout mask on its path spared the coordinates that carry it. The masks are independent, so the
share is a product over the dropout sites on the path, and it is judged two-sided in binomial standard deviations.

`residual_dropout` zeroes every sub-layer (weights and biases, normalisations kept): each outputs exactly 0, so dropout
on its output changes nothing, and in train mode only the embeddings' dropout acts. Inputs are two-hot,
s * (e_j - e_k): kept on both coordinates (probability (1 - p)^2) the output is the eval output (a LayerNorm maps
such a vector to itself up to scale), otherwise it is not. A stack with no embedding dropout leaves every output as
in eval; one that drops the residual stream (after the sum, or after the LayerNorm) draws another mask at every
sub-layer, and the share falls to (1 - p)^(2 (1 + sub-layers)).

`dropout_sites` counts every other mask. Let u = e_0 + e_1 - e_2 - e_3 and w = e_4 + e_5 - e_6 - e_7. Every weight
matrix of the encoder and decoder gets the rank-one pattern of u (at coordinates 0-3 modulo d_model, on either axis),
every other parameter there 0, the normalisations a gain of NORM_GAIN and no bias. Sequences have one position and the
positional encoding is off, so attention over one key returns its value, and with no biases every sub-layer maps its
input x to a multiple of u that is linear in x (the FFN's ReLU is positively homogeneous): W^V then W^O, W1 then W2.
The input is SCALE (u + w): sub-layers write along u, only the residual path carries w, so the ratio of the two, which
each LayerNorm keeps, records how much every sub-layer added. Dropout that keeps a value scales it by 1/(1-p) (or the
eval pass scales by 1-p), so where the paper's masks keep every coordinate they touch, 8 of the embeddings' and 4 of
each sub-layer's output, train mode gives the eval output of the same model with every sub-layer's output times
1/(1-p) (its matrices times (1-p)^(-1/2)); otherwise it does not. The share is (1-p)^(8 + 4L) over the L sub-layers on
the path (2N to an encoder output, 3N to the logits). A site the paper does not have, on attention probabilities (as
torch.nn and the Annotated Transformer have), on the values or on the FFN's activations, scales what its sub-layer adds
by another random factor (never exactly 1: the FFN's active units are fewer than 1/p), and so does a sub-layer output
without its dropout or with two: each leaves no output as computed, share 0. Rows are independent samples. Dropout on
queries or keys is not seen here: with one key, its probability is 1 whatever the query.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st
from torch import Tensor

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.groups import DROPOUT
from invariants.measure import ATTENTION_NAMES, normalisation_parameters, without_sublayer_weights, zero_sublayers
from invariants.subject import OWN_CONFIG, Overrides, Subject, seeded
from model.protocol import Seq2SeqModel
from model.registry import format_config_overrides

P_DROP = 0.3  # residual_dropout: both coordinates of a two-hot survive a mask with probability 0.49
SCALE = 1e8  # of the inputs: beside them a positional encoding moves a normalised output by ~1e-8, LayerNorm's eps by 0
SAMPLES, LENGTH = 32, 8  # residual_dropout: sequences x positions, 256 independent positions
POSITIONED = 4  # dropout_with_positions' sequences: 32 positions, each kept whole with probability 0.7^d_model or less
SAME = 1e-4  # relative difference counted as the eval output: LayerNorm eps shifts a rescaled input by <= 1e-5, a lost coordinate by >= 1e-2
VOCABULARY = (
    1000  # on the spec's own config: the sites do not depend on it, and 37000 logits per position cost most of a pass
)
SITE_P = 0.075  # dropout_sites runs at P_drop = SITE_P / N: shares (1-p)^(8 + 4L) of 0.2-0.5 at every N
ROWS = {True: 128, False: 512}  # dropout_sites' one-position sequences on the spec's own config (base: costly) / drawn
# Each sub-layer adds GROWTH / N times the stream's u part (half that for an FFN): small, so that the w part, which
# records what every sub-layer added, is still ~1/e of the stream after 3N sub-layers.
GROWTH = 1 / 3
NORM_GAIN = 1e3  # the normalisations' gain: their eps (1e-5) then moves an output by ~1e-11 when dropout rescales
MATCH = 1e-8  # relative difference counted as the same output: seen <= 2e-14 when it is, >= 6e-5 when it is not


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


def judged(
    shares: list[tuple[str, float, float, int]], why_high: str, why_low: str, like: str = "as in eval"
) -> tuple[float, str]:
    """The largest |deviation| over (name, share, expected, samples), and a note for those beyond the tolerance."""
    deviations = [(name, share, expected, deviation(share, expected, n)) for name, share, expected, n in shares]
    notes = [
        f"{name} {share:.1%} {like}, expected {expected:.1%} (off by {z:+.1f} std, the error measured here): "
        f"{why_high if z > 0 else why_low}"
        for name, share, expected, z in deviations
        if tol.DROPOUT_SITES.violated(abs(z))
    ]
    return max(abs(z) for *_, z in deviations), "; ".join(notes)


def describe_seeded(case: tuple[Overrides, int]) -> str:
    """A dropout check's case in words: the config and the seed of the dropout masks."""
    config, seed = case
    text = format_config_overrides(config) or "the spec's own config"
    return f"Case({text}; dropout seed={seed})"


def unattended(model: Seq2SeqModel) -> str:
    """Which attention of a one-position sequence attends to nothing (a row of zeros), '' when none does or the model
    cannot say: a cause of too few dropout masks that lies outside dropout."""
    if "attention_probs" in getattr(model, "unsupported", {}):
        return ""
    token = 2 if model.config.pad_id == 1 else 1
    ids, pad = torch.full((1, 1), token), torch.zeros(1, 1, dtype=torch.bool)
    try:
        with model.attention_probs() as records:
            model.decode(ids, model.encode(ids, pad), pad, pad)
        dead = [r for r in records if r.probs.dim() == 4 and bool((r.probs.double().sum(-1).abs() < 1e-6).any())]
    except Exception:  # the probe only explains; whatever it raises is softmax_rows' and the contract's to report
        return ""
    if not dead:
        return ""
    kinds = ", ".join(sorted({f"{ATTENTION_NAMES.get(r.kind, r.kind)} (layer {r.layer})" for r in dead}))
    return (
        f"likely a consequence of another failure, not of dropout: in a one-position sequence the {kinds} attends to "
        f"nothing (all-zero probabilities), so that sub-layer adds nothing and its dropout mask is never seen; "
        f"softmax_rows fails on this (a causal mask that hides the diagonal?): fix that first"
    )


def spec_config(subject: Subject, config: Overrides, p: float) -> Overrides:
    """The case's config with P_drop = p, and on the spec's own config a vocabulary of at most VOCABULARY."""
    if config:
        return {**config, "P_drop": p}
    return {"P_drop": p, "vocab_size": min(subject.config.vocab_size, VOCABULARY)}


@invariant(
    DROPOUT,
    tol.DROPOUT_SITES,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
    describe=describe_seeded,
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
    zero_sublayers(model.train(), biases=True)  # a fresh copy: nothing to restore; written again after the switch
    with seeded(seed):
        encoder = share_as_in_eval(model.encode(inputs, pad), memory)
        decoder = share_as_in_eval(model.decode(inputs, memory, pad, pad), logits)
    expected, n = (1 - P_DROP) ** 2, SAMPLES * length
    return judged(
        [("encoder outputs", encoder, expected, n), ("decoder logits", decoder, expected, n)],
        why_high=f"the embeddings' sums are not dropped (at P_drop={P_DROP})",
        why_low="dropout reaches the residual stream, or drops more than P_drop",
    )


def positioned(subject: Subject) -> str | None:
    """Not applicable without dropout or positions to drop."""
    if subject.config.pe == "none":
        return "config pe='none': no positional encoding to drop"
    return None


@invariant(
    DROPOUT,
    tol.DROPOUT,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
    applicable=positioned,
    describe=describe_seeded,
)
def dropout_with_positions(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With every sub-layer computing 0 and token embeddings of 0, train mode moves the outputs: dropout acts on the sum of the embeddings and the positional encodings, not on the embeddings before it (paper, section 5.4).

    The stacks' input is then the positional encoding alone; dropped before the positions are added, it is a mask on
    zeros, and train mode repeats the eval outputs bit for bit. Measured: the larger relative change of encoder
    outputs and logits between train and eval.
    """
    config, seed = case
    model = without_sublayer_weights(subject, spec_config(subject, config, P_DROP), biases=True)
    length = min(LENGTH, model.config.max_len)
    zeros = torch.zeros(POSITIONED, length, model.config.d_model, dtype=torch.float64)
    pad = torch.zeros(POSITIONED, length, dtype=torch.bool)
    memory = model.encode(zeros, pad)
    logits = model.decode(zeros, memory, pad, pad)
    zero_sublayers(model.train(), biases=True)  # a fresh copy: nothing to restore; written again after the switch
    with seeded(seed):
        encoder = relative(model.encode(zeros, pad), memory)
        decoder = relative(model.decode(zeros, memory, pad, pad), logits)
    unmoved = [name for name, change in (("encoder outputs", encoder), ("logits", decoder)) if change == 0.0]
    return min(encoder, decoder), (
        f"train mode leaves the {' and '.join(unmoved)} as in eval: the positional encoding is not dropped "
        "(dropout applied to the embeddings before the positions are added?)"
        if unmoved
        else ""
    )


def relative(train: Tensor, evaluated: Tensor) -> float:
    """max |train - eval| / max |eval|; inf where either is not finite."""
    if not (torch.isfinite(train).all() and torch.isfinite(evaluated).all()):
        return float("inf")
    return (train - evaluated).abs().max().item() / max(evaluated.abs().max().item(), 1e-300)


def signs(n: int, d_model: int, first: int = 0) -> Tensor:
    """(n,) a direction on an axis of n: +1 at coordinates first, first+1 modulo d_model, -1 at the next two, 0 elsewhere
    (first=0: u; first=4: w)."""
    index = torch.arange(n) % d_model - first
    return ((index >= 0) & (index < 2)).double() - ((index >= 2) & (index < 4)).double()


def pattern(shape: torch.Size, d_model: int, gain: float) -> Tensor:
    """A weight matrix that maps multiples of u to multiples of u (either axis may be the input):
    gain / 4 s_i s_j / sqrt(copies_i copies_j), s = `signs`, copies = ceil(n / d_model) on an axis of n. Two in a row
    (W^V then W^O; W_1, ReLU, W_2) multiply by gain^2 (gain^2 / 2 through the ReLU) however wide the space between."""

    def axis(n: int) -> Tensor:
        return signs(n, d_model) / math.sqrt(math.ceil(n / d_model))

    return 0.25 * gain * axis(shape[-2])[:, None] * axis(shape[-1])[None, :]


def stack_parameters(model: Seq2SeqModel) -> tuple[list[Tensor], dict[int, bool]]:
    """The encoder's and decoder's parameters but the embedding matrices, and of them the normalisations' (storage
    address -> is a bias)."""
    groups = model.parameter_groups()
    if not {"encoder", "decoder"} <= set(groups):
        raise NotApplicable(f"parameter_groups() names no encoder and decoder groups (it has {', '.join(groups)})")
    kept = {w.untyped_storage().data_ptr() for w in model.embedding_weights().values()}
    norms = {p.untyped_storage().data_ptr(): name.endswith("bias") for p, name in normalisation_parameters(model)}
    return [p for p in [*groups["encoder"], *groups["decoder"]] if p.untyped_storage().data_ptr() not in kept], norms


def proportional_sublayers(subject: Subject, config: Overrides) -> Seq2SeqModel:
    """A fresh float64 copy in which every sub-layer maps one-position sequences to multiples of u, linearly: every weight
    matrix of the encoder's and decoder's groups set to `pattern`, every other parameter there to 0, normalisations to
    a gain of NORM_GAIN."""
    return write_proportional(subject.fresh(config).eval())


def write_proportional(model: Seq2SeqModel) -> Seq2SeqModel:
    """proportional_sublayers' weights written into the model as it is: again after each mode switch, which some
    models answer by laying their weights out anew, so that the weights measured are the weights written."""
    parameters, norms = stack_parameters(model)
    d_model, gain = model.config.d_model, math.sqrt(GROWTH / model.config.N)
    with torch.no_grad():
        for p in parameters:
            address = p.untyped_storage().data_ptr()
            if address in norms:
                p.fill_(0.0 if norms[address] else NORM_GAIN)
            else:
                p.copy_(pattern(p.shape, d_model, gain).expand_as(p) if p.dim() >= 2 else torch.zeros_like(p))
    return model


def scale_sublayer_outputs(model: Seq2SeqModel, factor: float) -> None:
    """Multiply every sub-layer's output by factor: each of its two matrices on the value path by sqrt(factor) (on
    one-position sequences W^Q and W^K do not matter, and with no biases the sub-layers are homogeneous)."""
    parameters, norms = stack_parameters(model)
    with torch.no_grad():
        for p in parameters:
            if p.dim() >= 2 and p.untyped_storage().data_ptr() not in norms:
                p.mul_(math.sqrt(factor))


def wide_enough(config: Overrides) -> bool:
    """u and w take coordinates 0-7, and a LayerNorm'd stream needs others beside them."""
    return config["d_model"] >= 16


def site_shares(p: float, N: int) -> tuple[float, float]:
    """The shares as computed with one mask on the embeddings (8 coordinates) and one on each sub-layer's output (4):
    encoder outputs, logits."""
    return (1 - p) ** (8 + 4 * 2 * N), (1 - p) ** (8 + 4 * 3 * N)


@invariant(
    DROPOUT,
    tol.DROPOUT_SITES,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs().filter(wide_enough), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings", "positional_switch"),
    describe=describe_seeded,
)
def dropout_sites(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With sub-layers that add multiples of one direction, train mode gives the eval outputs with every sub-layer's output times 1/(1-p) in the share of rows that one dropout on each sub-layer's output and one on the embeddings leave whole, and none inside attention or the FFN (paper, section 5.4)."""
    config, seed = case
    N = config.get("N", subject.config.N)
    p = SITE_P / N
    model = proportional_sublayers(subject, spec_config(subject, config, p))
    d, rows = model.config.d_model, ROWS[not config]
    if d < 16:
        raise NotApplicable(
            f"d_model={d}: u and w take 8 coordinates, and a LayerNorm'd stream needs others beside them"
        )
    direction = signs(d, d) + signs(d, d, first=4)  # u + w
    inputs = (SCALE * direction).expand(rows, 1, d).clone()
    memory = (NORM_GAIN * math.sqrt(d / 8) * direction).expand(rows, 1, d).clone()  # as a LayerNorm outputs u + w
    pad = torch.zeros(rows, 1, dtype=torch.bool)
    with model.positional_encoding(False):
        write_proportional(model.train())  # a fresh copy: nothing to restore; written again after the switch
        with seeded(seed):
            encoded = model.encode(inputs, pad)
            logits = model.decode(inputs, memory, pad, pad)
        write_proportional(model.eval())
        scale_sublayer_outputs(model, 1 / (1 - p))
        expected_encoded = model.encode(inputs[:1], pad[:1])
        expected_logits = model.decode(inputs[:1], memory[:1], pad[:1], pad[:1])
    encoder = as_computed(encoded, expected_encoded)
    decoder = as_computed(logits, expected_logits)
    share_encoder, share_decoder = site_shares(p, model.config.N)
    error, note = judged(
        [
            ("encoder outputs", encoder.double().mean().item(), share_encoder, rows),
            ("decoder logits", decoder.double().mean().item(), share_decoder, rows),
        ],
        why_high=f"fewer dropout masks than one per sub-layer output and one on the embeddings (P_drop={p:.3g})",
        why_low=f"dropout where section 5.4 has none (inside attention or the FFN), or a sub-layer output dropped "
        f"twice or not at all (P_drop={p:.3g})",
        like="as computed with every sub-layer's output times 1/(1-p)",
    )
    cause = unattended(model) if note else ""
    return error, "; ".join(n for n in (note, cause) if n)


def as_computed(train: Tensor, expected: Tensor) -> Tensor:
    """Per row: the train-mode output equals the expected one to MATCH, relative to its size."""
    difference = (train - expected).abs().flatten(1).amax(-1) / expected.abs().max().clamp_min(1e-300)
    return difference < MATCH
