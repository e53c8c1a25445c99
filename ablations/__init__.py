"""The Table 3 ablation runner: data, BPE, training, perplexity, beam search, sacreBLEU, resumable runs.

Entry point: python -m ablations run --budget smoke --rows all (see docs/ablations.md).
"""

from invariants import shadowing  # noqa: F401  (before any import of model: a model.py hiding it is one line)
