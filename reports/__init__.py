"""Reports that mirror the paper: Table 3 side by side, figures, one index (`python -m reports`)."""

from invariants import shadowing  # noqa: F401  (before any import of model: a model.py hiding it is one line)
from model.extras import require

require("grid", "the reports")
