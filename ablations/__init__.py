"""The Table 3 ablation runner, in sub-packages along its flow. A module imports only from its own sub-package and
from those listed above it (tests/test_layering.py holds the rule):

    data/      the corpora, BPE, and batches of token ids
    runs/      the budgets and rows, a run's folder, its options and outcomes
    scoring/   perplexity, beam search and sacreBLEU
    training/  the training loop, ranks, clean stops, throughput, a trained run's weights
    grid/      the Table 3 grid: plan and run it, fan it out over processes or SLURM, check its rows' health
    studies/   cross-checks on the same batches (compare), the dropout gap, attention maps
    bench/     the benchmarks beside peers on a CPU and on a GPU, the GPU check, profiling, a row's cost

Entry point: python -m ablations run --budget smoke --rows all (see docs/ablations.md).
"""

import importlib.abc
import importlib.util
import sys

from invariants import shadowing  # noqa: F401  (before any import of model: a model.py hiding it is one line)
from model.extras import require

require("grid", "the Table 3 runner (ablations)")

# Modules a user ran by path before they moved into the sub-packages: `python -m` on the old name says the new one.
MOVED = {
    "ablations.compare": "ablations.studies.compare",
    "ablations.dropout_gap": "ablations.studies.dropout_gap",
    "ablations.fanout": "ablations.grid.fanout",
    "ablations.profiling": "ablations.bench.cpu.profiling",
    "ablations.rowcost": "ablations.bench.rowcost",
    "ablations.bench.profiling": "ablations.bench.cpu.profiling",
    "ablations.bench.gpu_check": "ablations.bench.check",
}


class MovedModule(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Finds the old names only; running or importing one exits with a line that names the new module."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def get_source(self, name: str) -> str:
        return f"raise SystemExit({f'{name} has moved: python -m {MOVED[name]}'!r})"

    def is_package(self, name: str) -> bool:
        return False


sys.meta_path.append(MovedModule())
