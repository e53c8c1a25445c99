"""Small broken adapters, each with the verdict it must get (verdicts.py)."""
