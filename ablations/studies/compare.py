"""`python -m ablations.studies.compare`: train Table 3 rows with several model specs, init rules and schedules on the same batches.

A cross-check of training itself: every entry (a spec @ an init rule, under one learning-rate schedule) trains through
the grid runner with the same data, batches and seed, so that two correct implementations of one row should trace the
same dev-PPL curve, and a pilot over schedules sees every row under each. Writes a table of dev PPL by step (BLEU at the
end, and which runs ended on the unigram plateau or collapsed) and one figure of the curves.

    python -m ablations.studies.compare --rows base,C1,C3 --steps 1000 \\
        --models reference@xavier reference@paper-width reference@normal hf-marian@normal torch-nn@xavier
    python -m ablations.studies.compare --rows base,C1,C3,C5,D2,B1,E1,big --models reference@normal \\
        --schedules 3e-3/500 1e-3/500 --steps 2000 --out reports/compare/pilot
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogFormatter, ScalarFormatter  # noqa: E402

from ablations.data.corpora import data_dir  # noqa: E402
from ablations.grid import health  # noqa: E402
from ablations.grid.runner import Grid, PreparedData, plan_run, prepare_data, run_grid  # noqa: E402
from ablations.runs import folder as R  # noqa: E402
from ablations.runs import options  # noqa: E402
from ablations.runs.budgets import BUDGETS, INIT_RULES, Budget, select_rows  # noqa: E402
from model.registry import ModelSpec, parse_spec  # noqa: E402
from plumbing import cli  # noqa: E402
from plumbing.files import write_atomic  # noqa: E402
from plumbing.provenance import git_commit, machine_line  # noqa: E402
from plumbing.stopping import Stopped, graceful_stops  # noqa: E402

COLUMNS = ["model", "row", "seed", "step", "dev_ppl", "bleu", "status", "run", "commit"]
PANELS_PER_LINE = 4  # rows' panels per line of the figure, so that eight rows stay readable
DEFAULT_MODELS = (
    "reference@xavier",
    "reference@paper-width",
    "reference@normal",
    "hf-marian@normal",
    "torch-nn@xavier",
)


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule of eq. (3)'s shape: its peak (for base's width) and its warmup steps."""

    lr_peak: float
    warmup: int

    def __str__(self) -> str:
        return f"{self.lr_peak:g}/{self.warmup}"


@dataclass(frozen=True)
class Entry:
    """One line of the comparison: a model spec trained under one init rule and one schedule (None: the budget's)."""

    spec: ModelSpec
    init: str
    schedule: Schedule | None = None

    @property
    def label(self) -> str:
        return f"{self.spec}@{self.init}" + (f" lr {self.schedule}" if self.schedule else "")

    def budget(self, b: Budget) -> Budget:
        b = b.replace(init=self.init)
        return b.replace(lr_peak=self.schedule.lr_peak, warmup=self.schedule.warmup) if self.schedule else b


def parse_entry(text: str, default_init: str) -> Entry:
    """'SPEC' or 'SPEC@RULE'; a bad rule is a one-line ValueError."""
    head, at, rule = text.partition("@")
    rule = rule if at else default_init
    if rule not in INIT_RULES:
        raise ValueError(f"--models {text!r}: init rule {rule!r} is not one of {', '.join(INIT_RULES)}")
    return Entry(parse_spec(head), rule)


def parse_schedule(text: str) -> Schedule:
    """'PEAK/WARMUP' such as '1e-3/500'; anything else is a one-line ValueError."""
    peak, slash, warmup = text.partition("/")
    try:
        schedule = Schedule(float(peak), int(warmup))
    except ValueError:
        schedule = None
    if not slash or schedule is None or not 0 < schedule.lr_peak < 1 or schedule.warmup < 1:
        raise ValueError(
            f"--schedules {text!r}: give PEAK/WARMUP such as 1e-3/500 (a peak in (0, 1), warmup steps >= 1)"
        )
    return schedule


def curves(entries: list[Entry], grids: list[Grid], data: PreparedData) -> pd.DataFrame:
    """One line per (entry, row, seed, evaluated step): dev PPL; the run's final BLEU and status on every line."""
    lines = []
    for entry, grid in zip(entries, grids):
        for row in grid.rows:
            for seed in grid.seeds:
                directory = plan_run(grid, row, seed, data).directory
                final = R.read_final(directory) or {}
                for record in R.read_metrics(directory):
                    if record.get("dev_ppl") is not None:
                        lines.append(
                            {
                                "model": entry.label,
                                "row": row.name,
                                "seed": seed,
                                "step": record["step"],
                                "dev_ppl": record["dev_ppl"],
                                "bleu": final.get("bleu"),
                                "status": final.get("status", "unfinished"),
                                "run": directory.name,
                                "commit": final.get("commit"),
                            }
                        )
    return pd.DataFrame(lines, columns=COLUMNS)


def table(found: pd.DataFrame, baseline: health.Baseline) -> str:
    """Markdown: per row and model, dev PPL at each evaluated step (mean over seeds), the final BLEU, and how many
    finished seeds ended on the plateau or collapsed."""
    if found.empty:
        return "(no run has been evaluated yet)\n"
    ppl = found.pivot_table(index=["row", "model"], columns="step", values="dev_ppl", aggfunc="mean", sort=False)
    ppl.columns = [f"PPL@{c}" for c in ppl.columns]
    ended = (
        found[found["status"] == "finished"].sort_values("step").groupby(["row", "model", "seed"], sort=False).last()
    )
    ended = ended.assign(verdict=[baseline.verdict(p) for p in ended["dev_ppl"]]).groupby(["row", "model"], sort=False)
    summary = pd.DataFrame(
        {
            "BLEU (end)": ended["bleu"].mean(),
            "ended": ended["verdict"].agg(lambda v: ", ".join(f"{n} {k}" for k, n in v.value_counts().items())),
        }
    )
    shown = ppl.join(summary).reset_index()
    means = ended[["dev_ppl", "bleu"]].mean().groupby("model", sort=False).mean()  # each row weighs the same
    overall = "; ".join(f"{m}: dev PPL {r.dev_ppl:.2f}, BLEU {r.bleu:.2f}" for m, r in means.iterrows())
    return (
        shown.to_markdown(index=False, floatfmt=".3g")
        + f"\n\nMean over rows of the last dev PPL and the BLEU (each row its mean over seeds): {overall}.\n"
    )


def figure(found: pd.DataFrame, path: Path, title: str) -> None:
    """Dev PPL against step, one panel per row, one line per model (mean over seeds) in one color everywhere, log scale."""
    rows, models = list(dict.fromkeys(found["row"])), list(dict.fromkeys(found["model"]))
    palette = dict(zip(models, sns.color_palette("tab10", len(models))))
    cols = min(max(len(rows), 1), PANELS_PER_LINE)
    lines = -(-max(len(rows), 1) // cols)
    fig, axes = plt.subplots(lines, cols, figsize=(3.6 * cols, 3.4 * lines), squeeze=False, sharey=True)
    for ax in axes.flat[len(rows) :]:
        ax.set_visible(False)
    for ax, row in zip(axes.flat, rows):
        sns.lineplot(
            found[found["row"] == row],
            x="step",
            y="dev_ppl",
            hue="model",
            hue_order=models,
            palette=palette,
            marker="o",
            ax=ax,
            legend=False,
            errorbar=None,
        )
        ax.set(yscale="log", title=f"row {row}", ylabel="dev PPL", xlabel="step")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter())  # 20, 30 rather than 2×10¹
    handles = [Line2D([], [], color=palette[m], marker="o", label=m) for m in models]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(len(models), 4),
        fontsize=8,
        bbox_to_anchor=(0.5, -0.02 - 0.05 * (len(models) // 5)),
    )
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, (0.08 + 0.05 * (len(models) // 5)) / lines, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_report(
    found: pd.DataFrame, out: Path, budget: Budget, command: str, data: PreparedData, schedules: bool
) -> None:
    schedule = (
        "schedules (peak lr/warmup) as labelled"
        if schedules
        else (
            f"peak lr {budget.lr_peak:g}, warmup {budget.warmup}"
            if budget.lr_peak
            else f"eq. (3)'s rate, warmup {budget.warmup}"
        )
    )
    title = (
        f"budget {budget.name}, {budget.steps} steps, {schedule}, {budget.batch_tokens}-token batches; "
        f"{data.preset}, {len(data.dev_src)} dev pairs"
    )
    baseline = health.measure(data)
    figure(found, out.with_suffix(".png"), title)
    write_atomic(out.with_suffix(".csv"), found.to_csv(index=False))
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    trained = ", ".join(sorted(found["commit"].dropna().unique())) or "none finished"
    drawn = git_commit()
    commits = f"commit {drawn}" if trained == drawn else f"runs trained at commit {trained}, drawn at {drawn}"
    write_atomic(
        out.with_suffix(".md"),
        f"# Training cross-check: {title}\n\n"
        f"Regenerate: `{command}` ({commits}, {date}, {machine_line()}, one thread per process).\n\n"
        f"![dev PPL by step]({out.with_suffix('.png').name})\n\n{table(found, baseline)}\n"
        f"`ended`: a finished run's last dev PPL (eval mode) above the vocabulary size ({baseline.vocab}, uniform) "
        f"is *collapsed*; above half the unigram PPL ({baseline.unigram_ppl:.0f}: every target token predicted by "
        f"its training frequency) it is on the *plateau*; below, it *learns*.\n",
    )


def parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog="python -m ablations.studies.compare", description=__doc__.split("\n")[0])
    p.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        help=f"SPEC[@RULE] entries, RULE one of {', '.join(INIT_RULES)} (default: {' '.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--schedules",
        nargs="+",
        type=str,
        default=[],
        help="PEAK/WARMUP schedules, each with every model, such as 3e-3/500 1e-3/500 (default: the budget's)",
    )
    p.add_argument("--rows", default="base,C1,C3", help="Table 3 rows (default base,C1,C3)")
    p.add_argument("--budget", default="cpu", choices=list(BUDGETS), help="budget (default cpu)")
    p.add_argument("--seeds", default="1", help="seed numbers: 1 or 1-3 (default 1)")
    p.add_argument("--steps", type=int, help="override the budget's steps")
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
        cli.check_counts(("--steps", args.steps), ("--dev-pairs", args.dev_pairs))
        budget = options.budget_with(args.budget, steps=args.steps, dev_pairs=args.dev_pairs)
        models = [parse_entry(text, budget.init) for text in args.models]
        schedules = [parse_schedule(text) for text in args.schedules] or [None]
        entries = [Entry(m.spec, m.init, schedule) for schedule in schedules for m in models]
        rows, seeds = select_rows(args.rows), options.parse_seeds(args.seeds)
        runs = Path(args.runs)
        options.check_runs_folder(runs)
        for entry in entries:
            options.check_model(entry.spec, entry.budget(budget), budget.preset)
        torch.set_num_threads(
            1
        )  # the scaled rows train fastest on one thread a process (ablations/training/throughput.py)
        grids = [Grid(e.budget(budget), rows, seeds, e.spec, runs, torch.device("cpu")) for e in entries]
        with graceful_stops():
            try:
                data = prepare_data(budget, budget.preset, data_dir(args.data), runs)
                for entry, grid in zip(entries, [] if args.report_only else grids):
                    print(f"{entry.label}: rows {args.rows}, seeds {args.seeds}", file=sys.stderr)
                    run_grid(grid, data)
            except Stopped as stop:
                print(
                    f"{stop}; finished runs are kept; resume with: python -m ablations.studies.compare {' '.join(argv)}",
                    file=sys.stderr,
                )
                return stop.exit_status
        command = "python -m ablations.studies.compare " + " ".join(a for a in argv if a != "--report-only")
        write_report(curves(entries, grids, data), Path(args.out), budget, command, data, bool(args.schedules))
    except options.FORESEEN as exc:
        return options.failed(exc)
    print(f"report -> {Path(args.out).with_suffix('.md')} and .png, .csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
