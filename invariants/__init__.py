"""The invariants suite: properties of the paper's design, checked on any model and proven able to fail.

    from invariants import run_suite, causal_future_tokens
    causal_future_tokens("reference")          # one property -> Result(verdict, worst_error, tolerance, ...)
    run_suite("torch-nn")                       # every property, grouped by the paper's sections

`python -m invariants --model SPEC` runs the suite and writes runs/invariants/<model>.md and .json (--out to choose).
"""

from invariants import shadowing  # noqa: F401  (first: a model.py or model/ hiding the harness's `model` is one line)
from invariants.behaviour import (
    attention_scaling,
    batch_independence,
    dropout_active,
    embedding_scaling,
    eval_determinism,
    fast_equals_explicit,
    gradients_reach_all,
    padding_invariance,
)
from invariants.block_order import post_ln_order
from invariants.causal import cached_decoding, causal_future_probs, causal_future_tokens, causal_jacobian
from invariants.cross_attention import residual_own_input, source_reaches_logits
from invariants.engine import NotApplicable, Property, Result
from invariants.feedforward import ffn_nonlinear, ffn_relu
from invariants.mutants import MUTANTS  # importing it registers mutant:NAME in the model registry
from invariants.objective import loss_eps_zero_is_nll, loss_pad_normalisation, loss_smoothed_minimum
from invariants.params import params_base, params_table3, params_tied_embeddings, tied_embeddings_in_use
from invariants.permutation import permutation_cross_attention, permutation_encoder, permutation_positive_control
from invariants.positional import pe_exact_values, pe_relative_linearity, pe_unit_scale, positions_distinguished
from invariants.residual import layer_norm_outputs, residual_paths
from invariants.softmax import fully_padded_rows, padding_probs_zero, softmax_rows
from invariants.subject import Subject
from invariants.sublayer_dropout import dropout_sites, dropout_with_positions, residual_dropout
from invariants.suite import PROPERTIES, run_suite

__all__ = [
    "MUTANTS",
    "PROPERTIES",
    "NotApplicable",
    "Property",
    "Result",
    "Subject",
    "run_suite",
    *(p.name for p in PROPERTIES),
]
