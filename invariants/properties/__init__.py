"""The properties, one module per group of invariants/groups.py, imported in the paper's order: importing them
registers each `@invariant` (invariants/engine.py), so adding a property is writing its function in its group's
module."""

from invariants.engine import REGISTRY
from invariants.properties import (  # noqa: F401  (the order here is the suite's order)
    causal,
    permutation,
    softmax,
    positional,
    parameters,
    behaviour,
    loss,
    residual,
    dropout,
    feedforward,
    cross_attention,
    oracle,
)

PROPERTIES = list(REGISTRY.values())
