"""The mutant registry: each mutant is one bug, a broken `Parts` seam or a reference subclass, and the properties it must fail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from model.transformer import Transformer

CAUSAL = ("causal_future_tokens", "causal_jacobian", "causal_future_probs", "cached_decoding")


@dataclass(frozen=True)
class Mutant:
    """A registered bug: what it is, the broken part (or subclass) that makes it, and the properties that must fail."""

    bug: str
    parts: dict[str, Any]
    caught_by: tuple[str, ...]
    known_bug: bool = True  # one of the fourteen bugs known from real code
    model: type[Transformer] = Transformer  # a subclass that overrides one step, for bugs no Parts seam reaches
    control: bool = False  # not a bug: a correct variant that must pass every property (no false failures)


MUTANTS: dict[str, Mutant] = {}  # filled by @register_mutant in attention.py, embeddings.py, stack.py, blocks.py


def register_mutant(
    name: str,
    bug: str,
    caught_by: tuple[str, ...],
    part: str | None = None,
    known_bug: bool = True,
    control: bool = False,
) -> Callable[[Any], Any]:
    """Decorator registering mutant `name`: the decorated object replaces Parts.<part>, or without `part` it is a
    Transformer subclass built in the reference's place. A name registered twice is a ValueError."""

    def register(broken: Any) -> Any:
        if name in MUTANTS:
            raise ValueError(f"mutant {name!r} is already registered")
        parts, model = ({part: broken}, Transformer) if part else ({}, broken)
        MUTANTS[name] = Mutant(bug, parts, caught_by, known_bug, model, control)
        return broken

    return register
