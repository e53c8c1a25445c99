"""`python -m reports` (= `nox -s report`): rebuild every report under reports/ from the results on disk, in seconds.

Builds, for every budget folder of ablation results, Table 3 (Markdown, HTML, LaTeX, CSV), when the paper's
conclusions appear along training (table and figure), the figures, and the attention map of the trained base model
when its weights were published; then the invariants heatmaps, and the index (which also links the benchmark's bench.md beside them when there is one).
Inputs that are missing are skipped with one line naming the command that produces them; when nothing at all can
be built the exit status is 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from ablations.runs import folder as R
from model.table3 import table3_rows
from plumbing.files import shown_path, writable_folder
from plumbing.stopping import stops_cleanly
from reports import attention, figures, glance, heatmaps, index, progress, table3, table3_formats, table3_text
from reports.index import Artifact
from reports.inputs import (
    ABLATIONS_COMMAND,
    BENCH_COMMAND,
    BENCH_REPORTS,
    INVARIANTS_DIR,
    KILL_MATRIX,
    RESULTS_DIR,
    BudgetResults,
    MissingInput,
    budget_folders,
    load_budget,
    load_invariants,
)

REBUILD = "nox -s report"
OUT_DIR = Path("reports")  # relative to the working directory, like the inputs' defaults


def build_budget(folder: Path, out_dir: Path) -> tuple[list[Artifact], list[str], pd.DataFrame | None]:
    """Table 3 in every format, its verdicts along training, and the figures of one budget's runs; returns the
    table too, where the budget's models translate at all (not smoke's), for the figure of the grids side by side."""
    results = load_budget(folder)
    table = table3.compare(results.runs)
    label = f"{results.budget} (scaled)" if results.scaled else results.budget
    fig_dir = out_dir / "figures" / results.budget
    artifacts, skipped = _table3_artifacts(folder, results, table, label, out_dir, fig_dir)
    section = f"Figures, budget {label}"
    artifacts += _comparison_figures(results, table, label, section, fig_dir)
    curves, curves_skipped = _training_figures(folder, results, label, section, fig_dir)
    attention_map, attention_skipped = _attention_figure(folder, results.budget, section, fig_dir)
    return (
        artifacts + curves + attention_map,
        skipped + curves_skipped + attention_skipped,
        table if figures.has_bleu(table) else None,
    )


def _table3_artifacts(
    folder: Path, results: BudgetResults, table: pd.DataFrame, label: str, out_dir: Path, fig_dir: Path
) -> tuple[list[Artifact], list[str]]:
    """The budget's Table 3 section: its formats and runs, led by when its conclusions appear along training."""
    summary = table3.summarize(table)
    source = f"Inputs: {shown_path(folder)}, produced by: {ABLATIONS_COMMAND.format(budget=results.budget)}"
    headline = table3_text.headline(results, table, summary)
    md, page, tex, numbers = table3_formats.write_all(results, table, summary, out_dir / "table3")
    section, skipped = f"Table 3 mirrored, budget {label}", []
    by_step = progress.by_step(results.curves)
    if len(by_step):  # the headline rides on the first entry: the agreement figure, else the table
        artifacts = _progress_artifacts(by_step, results.budget, label, section, headline, out_dir, fig_dir)
    else:
        artifacts = []
        skipped.append(
            f"agreement against steps for {results.budget}: no dev_ppl of base in any {R.METRICS} under {shown_path(folder)}"
        )
    artifacts += [
        Artifact(section, "Table 3 (Markdown, narrow)", md, REBUILD, "" if len(by_step) else headline),
        Artifact(section, "Table 3 (HTML page, wide)", page, REBUILD, f"{summary.line()} {source}"),
        Artifact(section, "Table 3 (LaTeX, booktabs)", tex, REBUILD),
        Artifact(
            section, "Table 3 numbers (CSV: means, spreads, changes, standard errors, verdicts)", numbers, REBUILD
        ),
    ]
    if (folder / "results.csv").is_file():
        artifacts.append(
            Artifact(
                section,
                "all runs (results.csv)",
                folder / "results.csv",
                ABLATIONS_COMMAND.format(budget=results.budget),
            )
        )
    return artifacts, skipped


def _progress_artifacts(
    by_step: pd.DataFrame, budget: str, label: str, section: str, headline: str, out_dir: Path, fig_dir: Path
) -> list[Artifact]:
    """When the paper's conclusions appear along training: the figure (carrying the headline), Markdown and CSV."""
    title = f"When do the paper's conclusions appear? Budget {label}"
    by_step_md, by_step_csv = progress.write(by_step, out_dir / "table3", budget, title, table3.SIGNIFICANCE)
    figures.agreement_by_step(by_step, fig_dir / "agreement_by_step.png", title)
    return [
        Artifact(
            section,
            "When do the paper's conclusions appear? Agreement share and Spearman ρ against steps",
            fig_dir / "agreement_by_step.png",
            REBUILD,
            headline,
        ),
        Artifact(section, "the same per evaluation step and group (Markdown)", by_step_md, REBUILD),
        Artifact(section, "the same (CSV)", by_step_csv, REBUILD),
    ]


def _comparison_figures(
    results: BudgetResults, table: pd.DataFrame, label: str, section: str, fig_dir: Path
) -> list[Artifact]:
    """Our changes against base beside the paper's, per row and per group, and params against dev PPL."""
    figures.change_against_change(
        table, fig_dir / "change_vs_paper.png", f"Our change against base vs the paper's, per row, budget {label}"
    )
    figures.group_changes(
        table,
        results.runs,
        fig_dir / "group_changes.png",
        f"Changes against base per group: ours, budget {label}, beside the paper's",
    )
    figures.params_against_ppl(
        table, fig_dir / "params_vs_ppl.png", f"Params against dev PPL: ours, budget {label}, and the paper's"
    )
    return [
        Artifact(
            section,
            "Our change against the paper's per row, coloured by verdict",
            fig_dir / "change_vs_paper.png",
            REBUILD,
        ),
        Artifact(
            section,
            "Changes in PPL and BLEU per group (A-E), ours beside the paper's",
            fig_dir / "group_changes.png",
            REBUILD,
        ),
        Artifact(section, "Params against dev PPL, ours and the paper's", fig_dir / "params_vs_ppl.png", REBUILD),
    ]


def _training_figures(
    folder: Path, results: BudgetResults, label: str, section: str, fig_dir: Path
) -> tuple[list[Artifact], list[str]]:
    """Every row's loss and dev PPL curves and its training speed, each skipped when the runs did not log it."""
    artifacts, skipped = [], []
    order = [r.name for r in table3_rows()]
    for metric, what in (("loss", "training loss"), ("dev_ppl", "dev perplexity")):
        if results.curves[metric].notna().any():
            path = fig_dir / f"curves_{metric}.png"
            figures.training_curves(results.curves, metric, path, f"{what} per row, budget {label}", order)
            artifacts.append(Artifact(section, f"Training curves: {what} of every row", path, REBUILD))
        else:
            skipped.append(
                f"{what} curves for {results.budget}: no {metric} in any {R.METRICS} under {shown_path(folder)}"
            )
    if results.runs["tokens_per_s"].notna().any():
        figures.tokens_per_second(
            results.runs, fig_dir / "tokens_per_s.png", f"training tokens/s per row, budget {label}", order
        )
        artifacts.append(Artifact(section, "Training tokens/s per row", fig_dir / "tokens_per_s.png", REBUILD))
    else:
        skipped.append(f"tokens/s for {results.budget}: no tokens_per_s in the runs' {R.FINAL}")
    return artifacts, skipped


def _attention_figure(folder: Path, budget: str, section: str, fig_dir: Path) -> tuple[list[Artifact], list[str]]:
    """The trained base model's encoder self-attention, where the budget published its map (cf. Figures 3-5)."""
    try:
        attention.draw(folder, fig_dir / "attention.png")
    except MissingInput as missing:
        return [], [
            f"attention figure for {budget}: {missing}; publishing a budget whose runs folder holds "
            f"base's checkpoint saves {attention.PUBLISHED}"
        ]
    return [
        Artifact(
            section,
            "Encoder self-attention of the trained base model (cf. the paper's Figures 3-5)",
            fig_dir / "attention.png",
            REBUILD,
        )
    ], []


def build_side_by_side(tables: dict[str, pd.DataFrame], out_dir: Path) -> list[Artifact]:
    """With two or more budgets whose models translate: their verdicts against the paper in one figure."""
    if len(tables) < 2:
        return []
    path = out_dir / "figures" / "budgets_side_by_side.png"
    heatmaps.budgets_side_by_side(tables, path, f"Table 3's verdicts under each budget: {', '.join(tables)}")
    return [
        Artifact(
            "Budgets side by side",
            "Each row's verdict against the paper under every budget, with our change",
            path,
            REBUILD,
        )
    ]


def build_invariants(folder: Path, out_dir: Path) -> list[Artifact]:
    """The verdict matrix (models x properties), the mutant kill matrix, and links to every invariants report."""
    inv = load_invariants(folder)
    section, artifacts = "Invariants", []
    if len(inv.verdicts):
        path = out_dir / "figures" / "invariants_verdicts.png"
        heatmaps.verdict_heatmap(
            inv.verdicts, "model", path, "Invariants: verdict per model and property", heatmaps.VERDICTS
        )
        tally = inv.verdicts.groupby("model")["verdict"].value_counts().unstack(fill_value=0)
        note = "; ".join(
            f"{m}: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) for m, counts in tally.iterrows()
        )
        artifacts.append(Artifact(section, "Verdict matrix (models x properties)", path, REBUILD, note))
    if len(inv.kills):
        path = out_dir / "figures" / "kill_matrix.png"
        heatmaps.verdict_heatmap(
            inv.kills, "mutant", path, "Mutant kill matrix: a failing property kills the mutant", heatmaps.KILLS
        )
        killed = inv.kills[inv.kills["verdict"] == "fail"]["mutant"].nunique()
        note = f"{killed} of {inv.kills['mutant'].nunique()} mutants killed by at least one property"
        artifacts.append(Artifact(section, "Mutant kill matrix (mutants x properties)", path, REBUILD, note))
    kill_md = folder / KILL_MATRIX.replace(".json", ".md")
    for path, kind in ((kill_md, "Markdown"), (folder / KILL_MATRIX, "JSON")):
        if path.is_file():
            artifacts.append(Artifact(section, f"Kill matrix ({kind})", path, inv.kill_command))
    for reports, where in ((inv.models, section), (inv.mutants, "Invariants reports of the mutants")):
        for report in reports:
            for path, kind in ((report.path.with_suffix(".md"), "Markdown"), (report.path, "JSON")):
                if path.is_file():
                    artifacts.append(Artifact(where, f"{report.model} ({kind})", path, report.command))
    return artifacts


def build(results_dir: Path, invariants_dir: Path, out_dir: Path) -> tuple[list[Artifact], list[str]]:
    """Everything that the inputs on disk allow; returns what was written and one line per input that was missing."""
    artifacts, skipped = [], []
    try:
        folders = budget_folders(results_dir)
    except MissingInput as missing:
        folders, skipped = [], [f"Table 3 and its figures: {missing}"]
    tables = {}
    for folder in folders:
        built, passed_over, table = build_budget(folder, out_dir)
        artifacts += built
        skipped += passed_over
        if table is not None:
            tables[folder.name] = table
    artifacts += build_side_by_side(tables, out_dir)
    try:
        artifacts += build_invariants(invariants_dir, out_dir)
    except MissingInput as missing:
        skipped.append(f"invariants heatmaps: {missing}")
    artifacts += [
        Artifact("Benchmark", f"Training tokens/s, MFU and beam-search speed ({name})", out_dir / name, BENCH_COMMAND)
        for name in BENCH_REPORTS
        if (out_dir / name).is_file()
    ]
    return artifacts, skipped


@stops_cleanly("some reports may be rebuilt and others not; run the same command again (it rebuilds them all)")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS_DIR,
        help="ablation results, one folder per budget (default: reports/results)",
    )
    parser.add_argument(
        "--invariants", type=Path, default=INVARIANTS_DIR, help="invariants reports (default: reports/invariants)"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the reports go (default: reports/)")
    args = parser.parse_args(argv)
    try:
        writable_folder(args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    artifacts, skipped = build(args.results, args.invariants, args.out)
    for line in skipped:
        print(f"skipped: {line}", file=sys.stderr)
    if not artifacts:
        return 2
    written = index.write(artifacts, skipped, args.out, REBUILD)
    written += glance.write(args.results, args.invariants, args.out)  # README.md's glance, docs' property table
    built = [a.path for a in artifacts if a.command == REBUILD] + written
    for path in built:
        print(f"wrote {shown_path(path)}")
    print(
        f"{len(built)} files written, {len(artifacts) + len(written) - len(built)} inputs linked, in "
        f"{time.perf_counter() - start:.1f} s; open {shown_path(written[0])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
