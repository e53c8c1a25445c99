"""Each broken adapter of this folder, the properties it is run on, and the verdict and words it must get.

The adapters are small files of the kind users write, each with one thing wrong (most subclass the reference model
and break one member). `tests/invariants/test_broken_adapters.py` runs every row; `python -m tests.invariants.broken`
prints the table that docs/invariants.md shows, from a real run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"
TIMEOUT_S = 1.0  # the rows that hang are stopped after this; the others get a limit no busy machine reaches


@dataclass(frozen=True)
class Row:
    """An adapter file of this folder, run on `only` (comma-separated properties) at `overrides`: every property run
    must get `verdict`, and the first one's reason must contain `says`."""

    adapter: str
    only: str
    verdict: str
    says: str
    overrides: str = SMALL
    timeout: float = 120.0

    def spec(self) -> str:
        return f"{HERE / self.adapter}.py:make,{self.overrides}"


ROWS = [
    Row(
        "short_logits",
        "causal_future_tokens,eval_determinism",
        "error",
        "forward returned a float64 tensor of shape (2, 4, 49)",
    ),
    Row(
        "nan_logits",
        "residual_own_input,dropout_active",
        "error",
        "forward returned logits (B, T, vocab_size) = (2, 4, 50) holding NaN",
    ),
    Row("inf_logits", "post_ln_order", "error", "holding Inf"),
    Row("half_logits", "dropout_sites,attention_scaling", "error", "forward returned a float16 tensor"),
    Row("integer_logits", "eval_determinism", "error", "forward returned a int64 tensor"),
    Row("tuple_logits", "padding_invariance", "error", "forward returned a tuple of 2"),
    Row("list_logits", "padding_invariance", "error", "forward returned a list of 2"),
    Row("transposed_logits", "causal_future_tokens", "error", "shape (2, 50, 4)"),
    Row("loss_float", "loss_eps_zero_is_nll,gradients_reach_all", "error", "loss returned a float"),
    Row("loss_nan", "loss_pad_normalisation", "error", "loss returned nan on finite logits"),
    Row("loss_per_token", "loss_smoothed_minimum", "error", "loss returned a float64 tensor of shape (2, 4)"),
    Row("loss_detached", "gradients_reach_all", "error", "no gradient to the logits"),
    Row("loss_raises", "loss_eps_zero_is_nll", "error", "loss raised RuntimeError: loss is computed by the trainer"),
    Row("loss_raises", "eval_determinism", "pass", ""),  # a property that never calls loss still runs
    Row("config_dict", "eval_determinism,params_base", "error", "config is a dict"),
    Row("config_own_object", "eval_determinism", "error", "config is a SimpleNamespace"),
    Row("unsupported_none", "eval_determinism", "error", "unsupported is a NoneType"),
    Row("unsupported_list", "cached_decoding", "error", "unsupported is a list of 1; it must be a mapping"),
    Row("unsupported_unknown", "eval_determinism", "error", "unsupported names 'kv-cache'"),
    Row("encode_transposed", "permutation_encoder", "error", "encode returned a float64 tensor of shape (3, 2, 16)"),
    Row("decode_nan", "cached_decoding", "error", "decode must return logits"),
    Row("embed_unscaled_shape", "embedding_scaling", "error", "embed returned a float64 tensor of shape (2, 4)"),
    Row("refuses_float64", "eval_determinism", "error", "forward raised AssertionError: float32 only"),
    Row("to_float64_raises", "eval_determinism,params_base", "error", "in float64 raised"),
    Row("forward_raises", "batch_independence", "error", "forward raised RuntimeError: CUDA out of memory (simulated)"),
    Row("forward_raises", "params_base", "pass", ""),  # counting parameters needs no forward
    Row(
        "forward_not_implemented",
        "eval_determinism",
        "error",
        "forward raised NotImplementedError; every model must have it",
    ),
    Row(
        "pe_table_extra_row",
        "pe_exact_values,pe_relative_linearity",
        "error",
        "positional_table(4) returned a float64 tensor of shape (5, 16)",
    ),
    Row("pe_table_transposed", "pe_relative_linearity", "error", "shape (16, 4)"),
    Row("too_large", "eval_determinism", "error", "building the model at the spec's own config in float64 raised"),
    Row(
        "forward_hangs", "eval_determinism", "error", "forward did not return within the time limit", timeout=TIMEOUT_S
    ),
    Row("pe_switch_hangs", "permutation_encoder", "error", "timed out after 1 s", timeout=TIMEOUT_S),
    Row("pe_switch_hangs", "eval_determinism", "pass", ""),  # the run goes on after a timeout
    Row(
        "embedding_weights_raises", "params_tied_embeddings", "error", "embedding_weights raised KeyError: 'generator'"
    ),
    Row("parameter_groups_none", "params_base,ffn_relu", "error", "parameter_groups returned a NoneType"),
    Row("parameter_groups_none", "causal_future_tokens", "pass", ""),
    Row("nan_in_train_mode", "dropout_active", "fail", "not a finite number, which never passes"),
    Row("nan_for_long_sources", "dropout_active", "fail", "not a finite number, which never passes"),
    Row("nan_for_long_sources", "causal_future_tokens", "fail", "not a finite number, which never passes"),
    Row("attention_records_raise", "softmax_rows", "error", "raised ValueError: capture broke (in the model's"),
    Row("relayout_on_mode", "dropout_sites,residual_dropout,dropout_with_positions", "pass", ""),
    Row("forward_exits", "eval_determinism", "error", "forward raised SystemExit"),
    Row("sublayers_raise", "oracle_encoder", "fail", "could not localise: paper_sublayers raised RuntimeError"),
    Row("sublayers_list", "oracle_encoder", "fail", "could not localise: paper_sublayers returned a list"),
]
