"""A run's identity, and so the name of its folder, never changes: a grid started again (the one running in the
background included) finds the runs it finished and skips them.

The expected hashes were recorded with the code of commit 825d464, before run folders had an owner of their own
(ablations/runs/folder.py) and before the run request became one value (ablations/runs/options.py).
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ablations.grid.runner import Grid, plan_run
from ablations.runs import folder as R
from ablations.runs.budgets import BUDGETS, Budget, select_rows
from model.registry import parse_spec
from tests.helpers import REPO

COMMITTED = R.run_folders(REPO / "reports" / "results")  # cpu-xavier's were recorded under budget cpu, before init

SMOKE_BPE = "6896cc7c67a06d43"  # the key of the smoke budget's BPE (the committed smoke grid's, and a fresh one's)
SMOKE = {  # row: key, for the smoke budget, seed 1, the reference model, in the paper's order
    "base": "9ffd5f95",
    "A1": "4df52a9e",
    "A2": "a7232da5",
    "A3": "f269463d",
    "A4": "bc43d4fc",
    "B1": "6a5d66e5",
    "B2": "81e5926b",
    "C1": "e02b41ed",
    "C2": "d6551a25",
    "C3": "c7196061",
    "C4": "cc1c1213",
    "C5": "a37140c1",
    "C6": "c8fefb9c",
    "C7": "2970b0e9",
    "D1": "956e6414",
    "D2": "d92dd59a",
    "D3": "bbb34bfb",
    "D4": "8db3adce",
    "E1": "3bd6d798",
    "big": "88324b1e",
}
# (spec, init rule, row): the cpu budget at 1000 steps and 300 dev pairs, as `python -m ablations.studies.compare --steps 1000
# --dev-pairs 300` trains them (the cross-check running beside this work has folders of these names)
COMPARE = {
    ("reference", "xavier", "base"): "9665cbbf",
    ("reference", "xavier", "C1"): "6d9da761",
    ("reference", "xavier", "C3"): "0380ab82",
    ("reference", "paper-width", "base"): "ee9a527b",
    ("reference", "paper-width", "C1"): "26dff280",
    ("reference", "paper-width", "C3"): "0051a7c9",
    ("reference", "normal", "base"): "8a5993d5",
    ("reference", "normal", "C1"): "fc0ba910",
    ("reference", "normal", "C3"): "8e4d8b59",
    ("hf-marian", "xavier", "base"): "393629e1",
    ("hf-marian", "xavier", "C1"): "96208c21",
    ("hf-marian", "xavier", "C3"): "9fbc87d2",
    ("hf-marian", "paper-width", "base"): "669dfe30",
    ("hf-marian", "paper-width", "C1"): "56e5f4ab",
    ("hf-marian", "paper-width", "C3"): "85bd4682",
    ("hf-marian", "normal", "base"): "67113a3c",
    ("hf-marian", "normal", "C1"): "d689896c",
    ("hf-marian", "normal", "C3"): "a8c3eeeb",
    ("torch-nn", "xavier", "base"): "de01a6ca",
    ("torch-nn", "xavier", "C1"): "a9f72ece",
    ("torch-nn", "xavier", "C3"): "b33c9ccb",
    ("torch-nn", "paper-width", "base"): "95cb04cd",
    ("torch-nn", "paper-width", "C1"): "d51cb660",
    ("torch-nn", "paper-width", "C3"): "e06b251e",
    ("torch-nn", "normal", "base"): "03982dfe",
    ("torch-nn", "normal", "C1"): "a43ca82d",
    ("torch-nn", "normal", "C3"): "df993964",
}
# (budget, device, accumulation, changes to the budget): row base, seed 3, reference, another BPE key. A GPU run's
# identity took its batch padding (pad_multiple 8) and attention kernel (efficient) on 2026-11-26, and on 2026-11-29
# its packing (pack, several pairs per row) and its precision: bf16 weights with fp32 master weights ('bf16-weights',
# ablations/training/precision.py), or bf16 autocast where asked. No GPU run had been published; CPU runs record none of
# them, and keep their names.
OTHERS = {
    ("short", "cuda", None, ()): "d1ec0de8",
    ("short", "cuda", None, (("precision", "bf16"),)): "09e92e28",
    ("paper", "cuda", 4, ()): "57e128fd",
    ("paper", "cuda", 4, (("precision", "bf16"),)): "2182af57",
    ("cpu-xavier", "cpu", None, ()): "25a70cf4",
    ("smoke", "cpu", 2, (("lr_peak", 1e-3), ("warmup", 7))): "6dcd0bb2",
}


def prepared(preset: str, bpe_key: str, vocab: int) -> SimpleNamespace:
    """What a run's identity takes from the prepared data: the preset, the BPE's key and its vocabulary."""
    return SimpleNamespace(preset=preset, bpe_key=bpe_key, sp=SimpleNamespace(get_piece_size=lambda: vocab))


def key(
    budget: Budget,
    row: str,
    seed: int,
    data: SimpleNamespace,
    spec: str = "reference",
    device: str = "cpu",
    accumulation: int | None = None,
) -> str:
    """The hash naming the folder of one run: the grid plans it as it plans every run."""
    table3_row = select_rows(row)[0]
    grid = Grid(budget, [table3_row], [seed], parse_spec(spec), Path("runs"), torch.device(device), accumulation)
    run = plan_run(grid, table3_row, seed, data)
    assert run.directory == Path("runs") / budget.name / f"{row}-s{seed}-{run.key}"
    return run.key


@pytest.mark.parametrize("row", list(SMOKE))
def test_a_smoke_run_keeps_its_identity(row):
    assert key(BUDGETS["smoke"], row, 1, prepared("multi30k", SMOKE_BPE, 1000)) == SMOKE[row]


@pytest.mark.parametrize("spec, init, row", list(COMPARE))
def test_a_run_of_the_training_cross_check_keeps_its_identity(spec, init, row):
    budget = BUDGETS["cpu"].replace(init=init, steps=1000, dev_pairs=300)
    assert key(budget, row, 1, prepared("multi30k", "ae97dd094fed1ad9", 2000), spec) == COMPARE[(spec, init, row)]


@pytest.mark.parametrize("name, device, accumulation, changes", list(OTHERS))
def test_gpu_settings_accumulation_and_overrides_keep_their_identity(name, device, accumulation, changes):
    budget = BUDGETS[name].replace(**dict(changes))
    data = prepared(budget.preset, "0123456789abcdef", 37000 if budget.scale == 1 else 2000)
    assert (
        key(budget, "base", 3, data, device=device, accumulation=accumulation)
        == OTHERS[(name, device, accumulation, changes)]
    )


@pytest.mark.parametrize("directory", COMMITTED, ids=lambda d: f"{d.parent.parent.name}/{d.name}")
def test_a_committed_run_is_named_by_the_hash_of_its_config(directory):
    identity = R.read_config(directory)
    assert directory.name == f"{identity['row']}-s{identity['seed']}-{R.config_hash(identity)}"


def test_committed_runs_are_there_to_check():
    assert len(COMMITTED) >= 20


def recorded_train(budget: str, device: str) -> dict:
    """The training settings that config.json records for base, seed 1, of `budget` on `device`."""
    row = select_rows("base")[0]
    grid = Grid(BUDGETS[budget], [row], [1], parse_spec("reference"), Path("runs"), torch.device(device))
    return plan_run(grid, row, 1, prepared("news", "0123456789abcdef", 37000)).identity["train"]


def test_a_gpu_run_records_its_batch_padding_and_attention_kernel_and_a_cpu_run_neither():
    gpu = recorded_train("short", "cuda")
    assert gpu["pad_multiple"] == 8 and gpu["sdpa_backend"] == "efficient" and gpu["compile"] is True
    assert gpu["precision"] == "bf16-weights" and recorded_train("short", "cpu")["precision"] == "fp32"
    assert "pad_multiple" not in recorded_train("cpu", "cpu") and "sdpa_backend" not in recorded_train("short", "cpu")
