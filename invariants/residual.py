"""Invariant 7: residual connections and layer normalisation (section 3.1): "the output of each sub-layer is
LayerNorm(x + Sublayer(x))"; where dropout goes is in sublayer_dropout.py.

With every weight matrix of the encoder's and decoder's sub-layers set to zero, a sub-layer computes a constant
(its biases), so each layer is LayerNorm(x + constant): the input still reaches the output along the residual
path, and different tokens stay different. A stack that drops one residual connection computes
LayerNorm(constant) there instead, the same vector at every position, and everything after it is the same too.
The weight matrices are the 2-D trainable parameters that parameter_groups() files under "encoder" and "decoder",
less the embedding and pre-softmax matrices; the check zeroes a fresh copy, never the subject's cached model.

On the same zeroed copy, each layer is LayerNorm(x + constant): as the input embeddings grow, the constants
vanish beside them and LayerNorm divides the scale away, so the outputs converge. A stack that leaves out its
LayerNorm computes x + constants, and its outputs grow with the input.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch.nn import Parameter

from invariants import tolerances as tol
from invariants.cases import small_configs
from invariants.engine import NotApplicable, invariant
from invariants.behaviour import relative_change
from invariants.subject import OWN_CONFIG, Overrides, Subject, distinctness, tokens
from model.protocol import Seq2SeqModel

GROUP = "7 residual connections, LayerNorm, dropout"
TOKENS = 8  # distinct tokens in the probe sequence (fewer when the vocabulary is smaller)
SCALES = (1e6, 1e10)  # input embedding sizes: constants of O(1) move a normalised output by ~1/scale


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


@invariant(
    GROUP,
    tol.RESIDUAL,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
)
def residual_paths(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With the sub-layers' weight matrices zeroed, distinct tokens still give distinct encoder outputs and logits: each sub-layer's input reaches its output (paper, section 3.1)."""
    config, seed = case
    model = without_sublayer_weights(subject, config)
    if model.config.d_model <= 2:
        raise NotApplicable(
            "d_model <= 2: LayerNorm maps every vector to one of two points, so tokens cannot stay apart"
        )
    n = min(TOKENS, model.config.vocab_size - 1)
    ids = tokens(model.config, (1, n), torch.Generator().manual_seed(seed), distinct=True)
    pad = torch.zeros_like(ids, dtype=torch.bool)
    with torch.no_grad():
        memory = model.encode(ids, pad)
        logits = model.decode(ids, memory, pad, pad)
    encoder, decoder = distinctness(memory[0]), distinctness(logits[0])
    lost = [
        name for name, d in (("encoder outputs", encoder), ("decoder logits", decoder)) if not d >= tol.RESIDUAL.value
    ]
    return min(encoder, decoder), (
        f"{' and '.join(lost)} are the same at every position: a residual path is missing" if lost else ""
    )


@invariant(
    GROUP,
    tol.NORMALISED,
    pinned=lambda s: [(OWN_CONFIG, 0)],
    cases=lambda s: st.tuples(small_configs(), st.integers(0, 2**16)),
    needs=("source_embeddings", "target_embeddings"),
)
def layer_norm_outputs(subject: Subject, case: tuple[Overrides, int]) -> tuple[float, str]:
    """With the sub-layers' weight matrices zeroed, input embeddings of size 1e6 and 1e10 give the same encoder outputs and logits: each layer ends in LayerNorm (paper, section 3.1)."""
    config, seed = case
    model = without_sublayer_weights(subject, config)
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    source, target = torch.randn(2, 1, TOKENS, cfg.d_model, generator=gen, dtype=torch.float64)
    pad = torch.zeros(1, TOKENS, dtype=torch.bool)
    memories, logits = [], []
    with torch.no_grad():
        for scale in SCALES:
            memories.append(model.encode(scale * source, pad))
            logits.append(model.decode(scale * target, memories[-1], pad, pad))
    encoder, decoder = relative_change(*memories, memories[-1]), relative_change(*logits, logits[-1])
    grown = [
        name
        for name, change in (("encoder outputs", encoder), ("decoder logits", decoder))
        if not change <= tol.NORMALISED.value
    ]
    return max(encoder, decoder), (
        f"{' and '.join(grown)} grow with the input: no LayerNorm after the residual sum" if grown else ""
    )
