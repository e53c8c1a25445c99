"""Read what the reports are built from: ablation results (results format of the runner) and invariants verdicts.

Ablation results live in one folder per budget, `<results>/<budget>/`, each run in a sub-folder holding
`config.json`, `metrics.jsonl` and, once it ended, `final.json` (committed results add `results.csv` and put the
run folders under `runs/`; a runner's own `runs/<budget>/` folder reads the same way). They are read with the
runner's own readers (ablations.runs.folder), from the final.json files that results.csv is gathered from. Invariants verdicts are
`<invariants>/<model>.json`, one per model, and `<invariants>/kill_matrix.json`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ablations.grid import health
from ablations.runs import folder as R
from plumbing.files import shown_path

RESULTS_DIR = Path("reports") / "results"  # default paths are relative to the working directory (the repository root)
INVARIANTS_DIR = Path("reports") / "invariants"
KILL_MATRIX = "kill_matrix.json"
PARTIAL_JSON = ".partial.json"  # invariants.report.PARTIAL: a run of some properties only, never a model's full report
ABLATIONS_COMMAND = "nox -s ablations -- run --budget {budget} && nox -s ablations -- publish --budget {budget}"
INVARIANTS_COMMAND = "nox -s invariants -- --model {model}"
KILL_MATRIX_COMMAND = "nox -s invariants -- --kill-matrix"
BENCH_REPORTS = ("bench.md", "bench.json", "profile.md")  # written into reports/ by `nox -s bench`
BENCH_COMMAND = "nox -s bench"


class MissingInput(Exception):
    """An input folder or file that is absent; the message is one line naming the command that produces it."""


_WARNED: set[Path] = set()  # damaged files already named, so that each gets one warning per run


def read_json(path: Path, command: str, shape: type = dict) -> dict | list | None:
    """The JSON in `path` when it parses to a `shape`; else None and one warning naming the file and the command that
    writes it again (a truncated, foreign or non-UTF-8 file is skipped: the reports keep every section they can build)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, shape):
            raise ValueError(f"holds a JSON {type(doc).__name__}, not an object")
        return doc
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        if path not in _WARNED:
            _WARNED.add(path)
            why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            R.warn(f"skipping {shown_path(path)}: damaged ({why}); regenerate it with `{command}`")
        return None


@dataclass(frozen=True)
class BudgetResults:
    """Every run of one budget: `runs` has one line per (row, seed), `curves` one line per logged step."""

    budget: str
    folder: Path
    runs: pd.DataFrame
    curves: pd.DataFrame
    train: dict[str, object]  # training settings of the base run (config.json "train"), for the header
    data: dict[str, object]  # data sizes of the base run (config.json "data"), for the header
    superseded: list[str]  # run folders left out because a newer run has the same row and seed
    baseline: health.Baseline | None  # the data's unigram and uniform PPL, to judge which runs learned

    @property
    def scaled(self) -> bool:
        """A budget whose models and data are shrunk (smoke): its values are not comparable to the paper's, only directions."""
        return "scaled" in self.runs and bool(self.runs["scaled"].fillna(False).astype(bool).any())


def budget_folders(results_dir: Path) -> list[Path]:
    """Budget folders under `results_dir` that hold at least one ended run (a final.json)."""
    if not results_dir.is_dir():
        raise MissingInput(
            f"no ablation results folder {shown_path(results_dir)}; produce it with `{ABLATIONS_COMMAND.format(budget='smoke')}`"
        )
    folders = [
        p
        for p in sorted(results_dir.iterdir())
        if p.is_dir() and any(R.final_problem(d, identity=True) is None for d in R.run_folders(p, R.FINAL))
    ]
    if not folders:
        raise MissingInput(
            f"no finished ablation runs under {shown_path(results_dir)}; produce them with `{ABLATIONS_COMMAND.format(budget='smoke')}`"
        )
    return folders


def _numbers(column: pd.Series) -> pd.Series:
    """Metrics as floats: null and missing (diverged or failed runs) become NaN."""
    return pd.to_numeric(column, errors="coerce").astype(float)


def load_budget(folder: Path) -> BudgetResults:
    """All runs of one budget folder: finished, diverged and failed ones (with NaN metrics), the newest per (row, seed);
    the older ones are named in `superseded` so that the header can say so."""
    runs = R.results_table(
        folder
    )  # the runner's own reader: one line per readable final.json (damaged ones: a warning)
    for column in ("dev_ppl", "bleu", "params", "steps", "tokens_seen", "tokens_per_s", "gemm_fraction", "wall_s"):
        runs[column] = _numbers(runs[column]) if column in runs else math.nan
    runs = runs.sort_values("date", kind="stable") if "date" in runs else runs
    newest = runs.drop_duplicates(["row", "seed"], keep="last")
    superseded = runs.drop(newest.index)["run_dir"].tolist()  # older runs of the same row and seed (another config)
    runs = newest.reset_index(drop=True)

    curves, train, data = [], {}, {}
    for directory in R.run_folders(folder):
        if directory.name in superseded:
            continue
        config = R.read_config(directory)
        if config is None or not isinstance(config.get("row"), str) or "seed" not in config:
            R.warn(f"skipping {directory / R.CONFIG}: not a run's {R.CONFIG} (damaged or foreign)")
            continue
        if config.get("row") == "base" and not train:
            train, data = dict(config.get("train") or {}), dict(config.get("data") or {})
        curves += [{"row": config["row"], "seed": config["seed"], **m} for m in R.read_metrics(directory)]
    columns = ["row", "seed", "step", "loss", "lr", "tokens_per_s", "time_s", "dev_ppl"]
    curves_df = pd.DataFrame(curves).reindex(columns=columns) if curves else pd.DataFrame(columns=columns)
    return BudgetResults(folder.name, folder, runs, curves_df, train, data, superseded, _baseline(folder))


def _baseline(folder: Path) -> health.Baseline | None:
    """The budget's published baseline; a damaged one is a warning, and the report then judges no run by it."""
    try:
        return health.read(folder)
    except ValueError as damaged:
        R.warn(f"{damaged}; until then the report does not say which runs learned")
        return None


@dataclass(frozen=True)
class InvariantsReport:
    """One model's invariants report: its JSON file, the model spec it checked, the command that wrote it."""

    path: Path
    model: str
    command: str


@dataclass(frozen=True)
class Invariants:
    """Verdicts of the invariants suite: `verdicts` long (model, property, verdict), `kills` long (mutant, property,
    verdict); the per-model reports, and the mutants' own reports behind the kill matrix."""

    folder: Path
    models: list[InvariantsReport]
    mutants: list[InvariantsReport]
    verdicts: pd.DataFrame
    kills: pd.DataFrame
    kill_command: str


def _reports(folder: Path) -> list[tuple[InvariantsReport, list[dict]]]:
    """Each `<model>.json` in folder (the kill matrix aside) with its list of property results."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.name == KILL_MATRIX or path.name.endswith(PARTIAL_JSON):
            continue  # a partial run (--only, a replay, Ctrl-C) sits beside the model's full report
        doc = read_json(path, INVARIANTS_COMMAND.format(model="SPEC"))
        try:
            model = doc.get("model", path.stem)
            found.append(
                (
                    InvariantsReport(path, model, doc.get("command") or INVARIANTS_COMMAND.format(model=model)),
                    [{"name": p["name"], "verdict": p["verdict"]} for p in doc["properties"]],
                )
            )
        except (AttributeError, KeyError, TypeError) as exc:
            if doc is not None and path not in _WARNED:
                _WARNED.add(path)
                R.warn(
                    f"skipping {shown_path(path)}: not an invariants report ({type(exc).__name__}: {exc}); "
                    f"regenerate it with `{INVARIANTS_COMMAND.format(model='SPEC')}`"
                )
    return found


def load_invariants(folder: Path) -> Invariants:
    """Every `<model>.json` and the kill matrix (with the mutants' reports under mutants/); either may be absent."""
    models = _reports(folder)
    kill_path = folder / KILL_MATRIX
    if not models and not kill_path.is_file():
        raise MissingInput(
            f"no invariants reports in {shown_path(folder)}; produce them with `{INVARIANTS_COMMAND.format(model='reference')}`"
        )
    verdicts = [
        {"model": r.model, "property": p["name"], "verdict": p["verdict"]} for r, props in models for p in props
    ]
    kills, kill_command = [], KILL_MATRIX_COMMAND
    matrix = read_json(kill_path, KILL_MATRIX_COMMAND) if kill_path.is_file() else None
    try:
        kill_command = (matrix or {}).get("command") or KILL_MATRIX_COMMAND
        kills = (
            [
                {"mutant": mutant, "property": prop, "verdict": matrix["verdicts"].get(mutant, {}).get(prop, "missing")}
                for mutant in matrix["mutants"]
                for prop in matrix["properties"]
            ]
            if matrix
            else []
        )
    except (AttributeError, KeyError, TypeError) as exc:
        kills = []
        R.warn(
            f"skipping {shown_path(kill_path)}: not a kill matrix ({type(exc).__name__}: {exc}); regenerate it with `{KILL_MATRIX_COMMAND}`"
        )
    return Invariants(
        folder,
        [r for r, _ in models],
        [r for r, _ in _reports(folder / "mutants")],
        pd.DataFrame(verdicts, columns=["model", "property", "verdict"]),
        pd.DataFrame(kills, columns=["mutant", "property", "verdict"]),
        kill_command,
    )
