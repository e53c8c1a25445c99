"""The invariants suite: properties of the paper's design, checked on any model and proven able to fail.

    from invariants import run_suite, causal_future_tokens
    causal_future_tokens("reference")          # one property -> Result(verdict, worst_error, tolerance, ...)
    run_suite("torch-nn")                       # every property, grouped by the paper's sections

`python -m invariants --model SPEC` runs the suite and writes runs/invariants/<model>.md and .json (--out to choose).
Every property is importable by its name from here; they live in invariants/properties/, one module per group.
"""

from invariants import shadowing  # noqa: F401  (first: a model.py or model/ hiding the harness's `model` is one line)
from invariants.engine import NotApplicable, Property, Result
from invariants.lm.mutants import LM_MUTANTS  # noqa: F401  (registers lm-mutant:NAME)
from invariants.mutants import MUTANTS  # importing it registers mutant:NAME in the model registry
from invariants.subject import Subject
from invariants.suite import BY_NAME, PROPERTIES, run_suite

__all__ = ["MUTANTS", "PROPERTIES", "NotApplicable", "Property", "Result", "Subject", "run_suite", *BY_NAME]


def __getattr__(name: str) -> Property:
    """`from invariants import causal_future_tokens`: a property by its name."""
    if name in BY_NAME:
        return BY_NAME[name]
    raise AttributeError(f"module 'invariants' has no attribute {name!r}")
