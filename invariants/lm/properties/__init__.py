"""The decoder-only properties, one module per group of invariants/lm/groups.py, imported in order: importing them
registers each `@lm_invariant` in LM_REGISTRY, apart from the encoder-decoders' registry."""

from functools import partial

from invariants.engine import Property, invariant

LM_REGISTRY: dict[str, Property] = {}
lm_invariant = partial(invariant, registry=LM_REGISTRY)

from invariants.lm.properties import masks, decoding, attention, positions, output  # noqa: E402, F401, I001

LM_PROPERTIES = list(LM_REGISTRY.values())
