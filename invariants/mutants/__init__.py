"""Deliberately broken models: the reference Transformer with one bug each, swapped in through a `Parts` seam
or a small subclass that overrides one step.

Each registers itself with `@register_mutant` on its broken part and is a model spec, `mutant:NAME`, so
`nox -s invariants -- --model mutant:no_causal_mask` shows a check failing. Fourteen (`known_bug`) are bugs that
have happened in real code; the rest are near misses, plausible bugs a person writes that a property must catch
(not the property's exact negation), at least one per property. `caught_by` names the properties that must fail
on the mutant (tests/invariants/test_mutants.py asserts it; the kill matrices in reports/invariants, at a small and
at the base config, show all). They live by the part they break: attention, embeddings, stack, blocks.
"""

from __future__ import annotations

from invariants.mutants import attention, embeddings, stack  # noqa: F401  (registering them fills MUTANTS, in this order)
from invariants.mutants import blocks  # noqa: F401  (then the block wiring's)
from invariants.mutants import subtle  # noqa: F401  (then those only a changed check sees, and the float32 control)
from invariants.mutants.registry import MUTANTS, Mutant, register_mutant
from model.config import TransformerConfig
from model.registry import register_model
from model.transformer import Parts, Transformer

__all__ = ["MUTANTS", "Mutant", "build", "register_mutant"]


@register_model("mutant", "a reference model with one known bug: mutant:NAME", takes="name")
def build(config: TransformerConfig, name: str | None) -> Transformer:
    """The reference model with mutant `name`'s bug; an unknown or missing name is a ValueError listing them."""
    if name not in MUTANTS:
        what = f"unknown mutant {name!r}" if name else "mutant needs a name (mutant:NAME)"
        raise ValueError(f"{what}; valid mutants: {', '.join(MUTANTS)}")
    mutant = MUTANTS[name]
    return mutant.model(config, Parts(**mutant.parts))
