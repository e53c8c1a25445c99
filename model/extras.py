"""The package's optional extras, by the modules they install: the checks need only the core (torch, numpy,
hypothesis, tabulate, tqdm); the Table 3 runner and the reports need `grid`, the HuggingFace adapters `hf`, the other
libraries' adapters `peers`, SLURM fan-out `slurm`. A command whose extra is missing says which to install, in one line."""

from __future__ import annotations

import importlib.util

EXTRA_OF = {
    "transformers": "hf",
    "x_transformers": "peers",
    "submitit": "slurm",
    **dict.fromkeys(("pandas", "seaborn", "matplotlib", "sacrebleu", "sentencepiece", "jinja2"), "grid"),
}


def require(extra: str, what: str) -> None:
    """Exit with one line naming the extra to install when a module of `extra` is missing (`what` needs it)."""
    missing = [m for m, e in EXTRA_OF.items() if e == extra and importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(
            f"error: {what} needs {', '.join(missing)}, which come with the {extra} extra: "
            f"pip install 'aiayn-harness[{extra}]' (or pip install -e '.[{extra}]' in a clone)"
        )
