"""The protocol's contract, checked once per model before any property: what each member returns, against what it must.

A property measures what a model does, and so trusts the types and shapes it is handed: logits one column short, NaN
logits or a loss that is a Python float would otherwise surface as false findings or as torch messages that never
name the member at fault. So the spec's own model is built in float64 (as most checks build it) and one tiny batch
goes through each member the properties call directly; a breach is one line naming the member, what it returned and
what model/protocol.py says, and the properties that call that member are not run (their verdict is `error`, with
that line). A member that raises NotImplementedError, or lacks a capability of model.protocol.CAPABILITIES, is left to
the capability probes (invariants/capabilities.py): that makes checks not applicable, not broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import torch
from torch import Tensor

from invariants.guard import TimedOut, harness_stop, member_at_fault
from model.batch import Batch
from model.config import TransformerConfig
from model.protocol import CAPABILITIES

GUIDE = "model/protocol.py and docs/plugging-in.md, adapter writers' reference"
WEIGHTS = ("source", "target", "generator")
PARAMS = ("params_base", "params_table3", "params_tied_embeddings")  # they count parameters, running no batch
# Who calls a member beyond forward/encode/decode (found in invariants/*.py; the capability probes call the rest).
USERS: dict[str, tuple[str, ...]] = {
    "loss": (
        "gradients_reach_all",
        "loss_eps_zero_is_nll",
        "loss_smoothed_minimum",
        "loss_pad_normalisation",
        "fully_padded_rows",
        "tied_embeddings_in_use",
    ),
    "embed": (
        "causal_jacobian",
        "softmax_rows",
        "padding_probs_zero",
        "embedding_scaling",
        "pe_unit_scale",
    ),
    "positional_table": ("pe_relative_linearity", "pe_exact_values", "pe_unit_scale"),
    "parameter_groups": (
        *PARAMS[:2],
        "ffn_relu",
        "residual_paths",
        "layer_norm_outputs",
        "residual_dropout",
        "dropout_with_positions",
        "dropout_sites",
    ),
    "embedding_weights": (
        "params_tied_embeddings",
        "tied_embeddings_in_use",
        "embedding_scaling",
        "residual_paths",
        "layer_norm_outputs",
        "residual_dropout",
        "dropout_with_positions",
        "dropout_sites",
    ),
}


class Breach(Exception):
    """A member that returned something the protocol does not allow; the message says what and what it must be."""


def depends(member: str, prop: str) -> bool:
    """Whether the property `prop` calls `member` (and so cannot be judged when the member breaks the contract)."""
    if member in USERS:
        return prop in USERS[member]
    if member in ("forward", "encode", "decode"):
        return prop not in PARAMS
    return True  # building the model, config, unsupported, float64: every property needs them


def described(x: object) -> str:
    """What a member returned, in a few words: 'a float64 tensor of shape (2, 4, 49)', 'a tuple of 2', 'a float'."""
    if isinstance(x, Tensor):
        return f"a {str(x.dtype).removeprefix('torch.')} tensor of shape {tuple(x.shape)} on {x.device}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__} ({str(x)[:40]})" if isinstance(x, (int, float, str)) else f"a {type(x).__name__}"


def tensor(x: object, member: str, shape: tuple[int, ...], what: str, dtype: torch.dtype) -> Tensor:
    """x when it is a finite floating tensor of this shape and dtype on the CPU (where the checks read it); else a Breach."""
    rule = f"{member} must return {what}, a {str(dtype).removeprefix('torch.')} tensor of shape {shape}"
    if not isinstance(x, Tensor):
        raise Breach(f"{member} returned {described(x)}; {rule}")
    if not x.is_floating_point() or x.dtype != dtype or tuple(x.shape) != shape:
        follow = " (follow .double(): the checks build the model in float64)" if x.dtype != dtype else ""
        raise Breach(f"{member} returned {described(x)}; {rule}{follow}")
    if x.device.type != "cpu":
        raise Breach(f"{member} returned {described(x)}; {rule} on the device of its inputs")
    if not torch.isfinite(x).all():
        bad = "NaN" if torch.isnan(x).any() else "Inf"
        raise Breach(f"{member} returned {what} holding {bad} on a plain batch; {rule}, finite")
    return x


def contract_batch(cfg: TransformerConfig) -> Batch:
    """Two sentences, 3 source and 4 target tokens (fewer where max_len is smaller), none of them padding."""
    token = next((t for t in range(1, max(cfg.vocab_size, 1)) if t != cfg.pad_id), 0)
    S, T = max(1, min(3, cfg.max_len)), max(1, min(4, cfg.max_len))
    src, tgt = torch.full((2, S), token), torch.full((2, T), token)
    return Batch(src, tgt, torch.zeros_like(src, dtype=torch.bool), torch.zeros_like(tgt, dtype=torch.bool))


def _config(model: object) -> TransformerConfig:
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, TransformerConfig):
        raise Breach(
            f"config is {described(cfg)}; it must be the model.TransformerConfig the factory received (keep it: "
            "self.config = config), which the checks read for d_model, vocab_size, pad_id and the rest"
        )
    return cfg


def _unsupported(model: object) -> None:
    declared = getattr(model, "unsupported", None)
    example = "{'kv_cache': 'why it is missing'}, or {} when nothing is"
    if not isinstance(declared, Mapping):
        raise Breach(f"unsupported is {described(declared)}; it must be a mapping capability -> reason, e.g. {example}")
    unknown = [k for k in declared if k not in CAPABILITIES]
    if unknown:
        raise Breach(
            f"unsupported names {', '.join(map(repr, unknown))}; its keys must be among {', '.join(CAPABILITIES)}"
        )


def _calls(model, cfg: TransformerConfig, batch: Batch) -> list[tuple[str, Callable[[], None]]]:
    """Each member the properties call directly, as a call that raises Breach when its result breaks the contract."""
    B, S, T = *batch.src.shape, batch.tgt.shape[1]
    V, d, f64 = cfg.vocab_size, cfg.d_model, torch.float64
    logits = f"logits (B, T, vocab_size) = {(B, T, V)}"

    def loss() -> None:
        with torch.enable_grad():
            x = batch.forward(model).detach().requires_grad_(True)
            value = model.loss(x, batch.tgt)
            rule = "loss must return a finite 0-d floating tensor that the logits' gradient flows from"
            if not isinstance(value, Tensor) or value.dim() != 0 or not value.is_floating_point():
                raise Breach(f"loss returned {described(value)}; {rule}")
            if not torch.isfinite(value):
                raise Breach(f"loss returned {value.item()} on finite logits; {rule}")
            if not value.requires_grad:
                raise Breach(f"loss returned a tensor with no gradient to the logits (detached?); {rule}")

    def positional_table() -> None:
        if "positional_table" in model.unsupported:
            return
        try:
            table = model.positional_table(T)
        except NotImplementedError:
            return  # a capability the model lacks: its probe makes the PE checks not applicable
        tensor(table, f"positional_table({T})", (T, d), "the rows added at positions 0..T-1", table.dtype)

    def encode() -> Tensor:
        return tensor(model.encode(batch.src, batch.src_pad), "encode", (B, S, d), "the memory (B, S, d_model)", f64)

    def decode() -> None:
        memory = model.encode(batch.src, batch.src_pad)
        tensor(model.decode(batch.tgt, memory, batch.src_pad, batch.tgt_pad), "decode", (B, T, V), logits, f64)

    def parameter_groups() -> None:
        groups = model.parameter_groups()
        rule = "parameter_groups must return a mapping part -> list of parameters ('embeddings', 'encoder', 'decoder')"
        if not isinstance(groups, Mapping) or not all(
            isinstance(ps, (list, tuple)) and all(isinstance(w, Tensor) for w in ps) for ps in groups.values()
        ):
            raise Breach(f"parameter_groups returned {described(groups)}; {rule}")

    def embedding_weights() -> None:
        weights = model.embedding_weights()
        rule = "embedding_weights must return a mapping with the tensors 'source', 'target' and 'generator'"
        if not isinstance(weights, Mapping) or not all(isinstance(weights.get(k), Tensor) for k in WEIGHTS):
            raise Breach(f"embedding_weights returned {described(weights)}; {rule}")

    # Members that others call come first, so that a breach is named where it is, not where it shows up.
    return [
        (
            "embed",
            lambda: tensor(model.embed(batch.tgt), "embed", (B, T, d), "the target embeddings (B, T, d_model)", f64),
        ),
        ("encode", encode),
        ("decode", decode),
        ("forward", lambda: tensor(batch.forward(model), "forward", (B, T, V), logits, f64)),
        ("loss", loss),
        ("positional_table", positional_table),
        ("parameter_groups", parameter_groups),
        ("embedding_weights", embedding_weights),
    ]


def check(build: Callable[[], object]) -> dict[str, str]:
    """Member -> the breach found, for the model `build()` returns (the spec's own, float64); empty when all hold.

    Building is part of it: a model that cannot be built, or refuses float64, breaks the contract as a whole. The
    model is left in eval mode and torch's random state as it was."""
    try:
        model = build()
    except TimedOut:
        return {"build": "building the model at the spec's own config did not end within the time limit (--timeout)"}
    except BaseException as exc:  # noqa: BLE001 - whatever the factory raises is the finding, named (SystemExit too)
        if harness_stop(exc):
            raise
        return {"build": f"building the model at the spec's own config in float64 raised {_raised(exc)}"}
    breaches: dict[str, str] = {}
    for member, judge in (("config", _config), ("unsupported", _unsupported)):
        try:
            judge(model)
        except Breach as breach:
            breaches[member] = str(breach)
    if breaches:
        return breaches
    model.eval()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for member, call in _calls(model, model.config, contract_batch(model.config)):
            if member == "decode" and "encode" in breaches:
                continue  # decode is given encode's output
            try:
                call()
            except Breach as breach:
                breaches[member] = f"{breach} ({GUIDE})"
            except TimedOut:
                breaches[member] = (
                    f"{member} did not return within the time limit (--timeout) on a batch of 2 sentences"
                )
                break
            except NotImplementedError:
                if member in ("forward", "encode", "decode", "loss", "parameter_groups", "embedding_weights"):
                    breaches[member] = f"{member} raised NotImplementedError; every model must have it ({GUIDE})"
            except BaseException as exc:  # noqa: BLE001 - the member's own failure, named (SystemExit too)
                if harness_stop(exc):
                    raise
                if member == "embed":
                    continue  # embed's failure is the target_embeddings capability's probe to report
                breaches[member] = f"{member} raised {_raised(exc)} on a plain float64 batch of 2 sentences ({GUIDE})"
    return breaches


def _raised(exc: BaseException) -> str:
    """What was raised, its first line, and the line of the model's own code that raised it."""
    said = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    where = member_at_fault(exc, innermost=True)
    return f"{type(exc).__name__}{': ' + said[:200] if said else ''}{' in ' + where if where else ''}"
