"""Refuse, in one line, to run with someone else's `model` (or `plumbing`) on the path, before anything imports it.

The harness's packages are top-level names (plumbing, model, invariants, ablations, reports). `python -m invariants`
puts the working directory first on sys.path, so a model.py or model/ there hides the harness's `model`, and the first
`from model.batch import ...` would end in a traceback about 'model.batch'. Imported first by invariants/__init__,
this module says instead which file hides it and what to run: the console script, which leaves the working directory
off sys.path. Adapter files never hide it: model/registry.py imports them by path under names of their own.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1]  # the folder holding the harness's packages (site-packages, a checkout)
SCRIPTS = {"invariants": "aiayn-invariants", "ablations": "aiayn-ablations", "reports": "aiayn-reports"}


def origin(name: str) -> Path | None:
    """Where the top-level module `name` is imported from (already, or by the next import): a file, or a package's
    folder; None when nothing of that name is found."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (or a namespace folder): its folder
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin else None


def shadowing(name: str) -> Path | None:
    """The file or folder that `name` resolves to when it is not the harness's own package of that name, else None."""
    found = origin(name)
    return found if found is not None and found != HARNESS / name else None


def shown(path: Path) -> str:
    """path as the user would type it: ./model.py or ./model/ under the working directory, else in full."""
    text = f"./{path.relative_to(Path.cwd().resolve())}" if path.is_relative_to(Path.cwd().resolve()) else str(path)
    return text + ("/" if path.is_dir() else "")


def running_module() -> str | None:
    """The module that `python -m` runs in this process (while its packages are imported or its __main__ runs)."""
    argv = sys.orig_argv
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None


def refuse(name: str = "model") -> None:
    """Stop when the harness's package `name` is hidden: under `python -m` of one of its modules, one line on stderr
    naming the console script to run instead, exit status 2; otherwise an ImportError with that line."""
    path = shadowing(name)
    if path is None:
        return
    module = running_module() or ""
    line = f"{shown(path)} shadows the harness's {name!r} package"
    if module.partition(".")[0] not in SCRIPTS:  # imported by a script or another tool: its caller decides
        raise ImportError(f"{line}; rename it, or keep its folder off sys.path")
    args = sys.orig_argv[sys.orig_argv.index("-m") + 2 :]
    fix = f"run {shlex.join([SCRIPTS[module], *args])} instead" if module in SCRIPTS else "run it from another folder"
    print(f"error: {line}; {fix}", file=sys.stderr)
    raise SystemExit(2)


for hidden in ("plumbing", "model"):  # the packages every harness module imports
    refuse(hidden)
