"""`python -m ablations.compare`: train Table 3 rows with several model specs and init rules on the same batches.

A cross-check of training itself: every entry (a spec, optionally @ an init rule) trains through the grid runner, with
the same data, batches, seed and schedule, so that two correct implementations of one row should trace the same
dev-PPL curve. Writes a table of dev PPL by step (and BLEU at the end) and one figure of the curves.

    python -m ablations.compare --rows base,C1,C3 --steps 1000 \\
        --models reference@xavier reference@paper-width reference@normal hf-marian@normal torch-nn@xavier
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402

import ablations.__main__ as cli  # noqa: E402
from ablations import runs as R  # noqa: E402
from ablations.budgets import INIT_RULES, Budget, select_rows  # noqa: E402
from ablations.data import data_dir  # noqa: E402
from ablations.grid import Grid, PreparedData, prepare_data, run_directory, run_grid  # noqa: E402
from ablations.stopping import Stopped, graceful_stops  # noqa: E402
from model.provenance import git_commit, machine_line  # noqa: E402
from model.registry import ModelSpec, parse_spec  # noqa: E402

DEFAULT_MODELS = ("reference@xavier", "reference@paper-width", "reference@normal", "hf-marian@normal", "torch-nn@xavier")


@dataclass(frozen=True)
class Entry:
    """One line of the comparison: a model spec trained under one init rule."""

    spec: ModelSpec
    init: str

    @property
    def label(self) -> str:
        return f"{self.spec}@{self.init}"


def parse_entry(text: str, default_init: str) -> Entry:
    """'SPEC' or 'SPEC@RULE'; a bad rule is a one-line ValueError."""
    head, at, rule = text.partition("@")
    rule = rule if at else default_init
    if rule not in INIT_RULES:
        raise ValueError(f"--models {text!r}: init rule {rule!r} is not one of {', '.join(INIT_RULES)}")
    return Entry(parse_spec(head), rule)


def curves(entries: list[Entry], grids: list[Grid], data: PreparedData) -> pd.DataFrame:
    """One line per (entry, row, seed, evaluated step): dev PPL; the run's final BLEU and status on every line."""
    lines = []
    for entry, grid in zip(entries, grids):
        for row in grid.rows:
            for seed in grid.seeds:
                directory = run_directory(grid, row, seed, data)
                final = R.read_final(directory / R.FINAL) or {}
                for record in R.read_metrics(directory / R.METRICS):
                    if record.get("dev_ppl") is not None:
                        lines.append({"model": entry.label, "row": row.name, "seed": seed, "step": record["step"],
                                      "dev_ppl": record["dev_ppl"], "bleu": final.get("bleu"),
                                      "status": final.get("status", "unfinished"), "run": directory.name})
    return pd.DataFrame(lines, columns=["model", "row", "seed", "step", "dev_ppl", "bleu", "status", "run"])


def table(found: pd.DataFrame) -> str:
    """Markdown: per row and model, dev PPL at each evaluated step (mean over seeds) and the final BLEU."""
    if found.empty:
        return "(no run has been evaluated yet)\n"
    ppl = found.pivot_table(index=["row", "model"], columns="step", values="dev_ppl", aggfunc="mean", sort=False)
    ppl.columns = [f"PPL@{c}" for c in ppl.columns]
    ended = found[found["status"] == "finished"]
    bleu = ended.groupby(["row", "model"], sort=False)["bleu"].mean().rename("BLEU (end)")
    shown = ppl.join(bleu).reset_index()
    return shown.to_markdown(index=False, floatfmt=".3g") + "\n"


def figure(found: pd.DataFrame, path: Path, title: str) -> None:
    """Dev PPL against step, one panel per row, one line per model (mean over seeds), log scale."""
    rows = list(dict.fromkeys(found["row"]))
    fig, axes = plt.subplots(1, max(len(rows), 1), figsize=(4.2 * max(len(rows), 1), 3.4), squeeze=False, sharey=True)
    for ax, row in zip(axes[0], rows):
        sns.lineplot(found[found["row"] == row], x="step", y="dev_ppl", hue="model", marker="o", ax=ax,
                     legend=ax is axes[0][-1], errorbar=None)
        ax.set(yscale="log", title=f"row {row}", ylabel="dev PPL", xlabel="step")
    if rows:
        axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_report(found: pd.DataFrame, out: Path, budget: Budget, command: str, data: PreparedData) -> None:
    title = (f"budget {budget.name}, {budget.steps} steps, peak lr {budget.lr_peak}, warmup {budget.warmup}, "
             f"{budget.batch_tokens}-token batches; {data.preset}, {len(data.dev_src)} dev pairs")
    figure(found, out.with_suffix(".png"), title)
    R.write_atomic(out.with_suffix(".csv"), found.to_csv(index=False))
    R.write_atomic(out.with_suffix(".md"), f"# Training cross-check: {title}\n\n"
                   f"Regenerate: `{command}` (commit {git_commit()}, {machine_line()}).\n\n"
                   f"![dev PPL by step]({out.with_suffix('.png').name})\n\n{table(found)}")


def parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog="python -m ablations.compare", description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help=f"SPEC[@RULE] entries, RULE one of {', '.join(INIT_RULES)} (default: {' '.join(DEFAULT_MODELS)})")
    p.add_argument("--rows", default="base,C1,C3", help="Table 3 rows (default base,C1,C3)")
    p.add_argument("--budget", default="cpu", choices=list(cli.BUDGETS), help="budget (default cpu)")
    p.add_argument("--seeds", default="1", help="seed numbers: 1 or 1-3 (default 1)")
    p.add_argument("--steps", type=int, help="override the budget's steps")
    p.add_argument("--warmup", type=int, help="override the budget's warmup")
    p.add_argument("--lr-peak", type=float, help="override the budget's peak learning rate")
    p.add_argument("--dev-pairs", type=int, help="score only the first N dev pairs")
    p.add_argument("--data", help="data folder (default $AIAYN_DATA or ../shared/data)")
    p.add_argument("--runs", default="runs/compare", help="runs root (default runs/compare)")
    p.add_argument("--out", default="reports/compare/cpu", help="report path without suffix: .md, .csv, .png")
    p.add_argument("--report-only", action="store_true", help="redraw from the runs on disk, train nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        cli.check_counts(("--steps", args.steps), ("--warmup", args.warmup), ("--dev-pairs", args.dev_pairs))
        budget = cli.budget_from(args)
        entries = [parse_entry(text, budget.init) for text in args.models]
        rows, seeds = select_rows(args.rows), cli.parse_seeds(args.seeds)
        runs = Path(args.runs)
        cli.check_runs_folder(runs)
        for entry in entries:
            cli.check_model(entry.spec, budget.replace(init=entry.init), budget.preset)
        torch.set_num_threads(1)  # the scaled rows train fastest on one thread a process (ablations/throughput.py)
        grids = [Grid(budget.replace(init=e.init), rows, seeds, e.spec, runs, torch.device("cpu")) for e in entries]
        with graceful_stops():
            try:
                data = prepare_data(budget, budget.preset, data_dir(args.data), runs)
                for entry, grid in zip(entries, [] if args.report_only else grids):
                    print(f"{entry.label}: rows {args.rows}, seeds {args.seeds}", file=sys.stderr)
                    run_grid(grid, data)
            except Stopped as stop:
                print(f"{stop}; finished runs are kept; resume with: python -m ablations.compare {' '.join(argv)}",
                      file=sys.stderr)
                return stop.exit_status
        command = "python -m ablations.compare " + " ".join(a for a in argv if a != "--report-only")
        write_report(curves(entries, grids, data), Path(args.out), budget, command, data)
    except (cli.DataError, cli.SpecError, ValueError, R.StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report -> {Path(args.out).with_suffix('.md')} and .png, .csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
