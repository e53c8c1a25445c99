"""python -m ablations run | results | publish  (also: nox -s ablations -- run ...; `run` may be left out)."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

import torch

import invariants.mutants  # noqa: F401  (registers mutant:NAME, so --model mutant:NAME trains a broken model)
from ablations.data.corpora import DataError, data_dir
from ablations.grid import health
from ablations.grid.runner import Grid, prepare_data, run_grid
from ablations.runs import folder as R
from ablations.runs import options
from ablations.runs.budgets import BUDGETS, Budget, as_recorded, row_config
from ablations.runs.options import RunOptions
from ablations.runs.outcomes import summary
from ablations.studies import attention_data
from ablations.training.distributed import backend, check_accumulation, from_environment, main_first, setup, teardown
from ablations.training.throughput import choose_threads
from plumbing import cli
from plumbing.files import write_atomic
from plumbing.stopping import Stopped, graceful_stops


def cmd_run(options: RunOptions) -> int:
    """The grid in this process, or data-parallel over the processes torchrun started (ablations/training/distributed.py)."""
    b, rows = options.budget, options.rows
    ranks = from_environment(options.ddp)
    check_accumulation(options.accumulation or b.accumulation, ranks)
    with graceful_stops():
        try:
            device = setup(ranks, options.device)
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            else:  # one thread for the scaled models unless asked (ablations/training/throughput.py says why)
                torch.set_num_threads(choose_threads(row_config(rows[0], b, vocab_size=1), options.threads))
            data = main_first(ranks, lambda: prepare_data(b, options.preset, options.data, options.runs))
            scaled = f" (SCALED: sizes / {b.scale})" if b.scaled else ""
            parallel = f" x {ranks.world} data-parallel processes (DDP over {backend(ranks)})" if ranks.parallel else ""
            if ranks.main:
                print(
                    f"budget {b.name}{scaled}, {len(rows)} rows x {len(options.seeds)} seeds, model {options.spec}, "
                    f"device {device}{parallel}; {data.summary}",
                    file=sys.stderr,
                )
            outcomes = run_grid(Grid.of(options, device, ranks), data)
        except Stopped as stop:
            if ranks.main:
                print(
                    f"{stop}; finished runs are kept; resume with: python -m ablations {shlex.join(['run', *options.argv])}",
                    file=sys.stderr,
                )
            return stop.exit_status
        finally:
            teardown()
    if not ranks.main:
        return 0
    print(summary([d for d, _ in outcomes], {d for d, s in outcomes if s == R.BUSY}), file=sys.stderr)
    return 1 if any(status == "failed" for _, status in outcomes) else 0


def cmd_results(args: argparse.Namespace) -> int:
    table = R.results_table(Path(args.runs))
    if table.empty:
        found = R.run_folders(Path(args.runs), R.FINAL)
        raise ValueError(
            f"no readable {R.FINAL} under {args.runs}"
            + (" (damaged ones skipped, see above)" if found else "")
            + "; run the grid first: python -m ablations run --budget smoke"
        )
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create its folder ({exc.strerror or exc})") from None
    if out.suffix == ".parquet":
        try:
            table.to_parquet(out, index=False)
        except ImportError:
            raise ValueError(f"writing {out} needs pyarrow (pip install pyarrow), or ask for a .csv file") from None
    else:
        write_atomic(out, table.to_csv(index=False))
    print(f"{len(table)} runs -> {out}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    """Copy a budget's results (no checkpoints) under reports/results/<budget>/ for readers, with the attention
    figure's data from base's weights and the data's baseline (ablations/grid/health.py) where those can be had."""
    source = Path(args.runs) / args.budget
    ended = [directory for directory, _ in R.ended_results(source)] if source.is_dir() else []
    if not ended:
        raise ValueError(f"no finished runs under {source}; run: python -m ablations run --budget {args.budget}")
    target = Path(args.out or Path("reports") / "results" / args.budget)
    for directory in ended:
        dest = target / "runs" / directory.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in R.PUBLISHED:
            if (directory / name).is_file():  # a run that failed before training has no metrics
                shutil.copyfile(directory / name, dest / name)
    table = R.results_table(target / "runs")
    write_atomic(target / "results.csv", table.to_csv(index=False))
    print(f"{len(ended)} runs -> {target}/results.csv and {target}/runs/")
    try:  # the attention figure's data from the trained base model (its weights stay in the runs folder)
        write_atomic(target / attention_data.PUBLISHED, json.dumps(attention_data.extract(source, decimals=4)))
        print(f"base's encoder attention -> {target / attention_data.PUBLISHED}")
    except attention_data.NoAttentionData as missing:
        print(f"no attention figure data: {missing}")
    try:  # the thresholds by which the reports judge whether each run learned (ablations/grid/health.py)
        budget, preset = recorded_data(BUDGETS[args.budget], ended)
        baseline = health.measure(prepare_data(budget, preset, data_dir(args.data), Path(args.runs)))
        print(f"unigram PPL {baseline.unigram_ppl:.0f} of the data -> {health.write(target, baseline)}")
    except DataError as missing:
        print(f"no {health.PUBLISHED}, so the reports cannot say which runs learned: {missing}")
    return 0


def recorded_data(budget: Budget, ended: list[Path]) -> tuple[Budget, str]:
    """The budget and preset with the data settings the runs recorded, so that the baseline is their own data's."""
    seen = {as_recorded(budget, R.read_config(directory) or {}) for directory in ended}
    if len(seen) != 1:
        raise DataError(
            f"the runs under {ended[0].parent} were trained on {len(seen)} different data settings (preset, BPE size, "
            "training or dev pairs); publish each set from its own --runs folder"
        )
    return seen.pop()


def parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog="python -m ablations", description="Train and score the rows of the paper's Table 3.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and score a grid of rows (resumes, skips finished runs)")
    options.add_arguments(run)
    res = sub.add_parser("results", help=f"gather every {R.FINAL} under --runs into one table")
    res.add_argument("--runs", default=str(options.DEFAULT_RUNS))
    res.add_argument("--out", default="results.csv", help="FILE.csv or FILE.parquet (needs pyarrow)")
    res.set_defaults(func=cmd_results)
    pub = sub.add_parser(
        "publish", help="copy a budget's results (no checkpoints) and its data's baseline to reports/results/<budget>/"
    )
    pub.add_argument("--budget", default="smoke", choices=list(BUDGETS))
    pub.add_argument("--runs", default=str(options.DEFAULT_RUNS))
    pub.add_argument("--out", help="target folder (default reports/results/<budget>)")
    pub.add_argument("--data", help="data folder, for the unigram baseline (default $AIAYN_DATA or ../shared/data)")
    pub.set_defaults(func=cmd_publish)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("--") and argv[0] != "--help":
        argv = ["run", *argv]  # the short form: python -m ablations --budget smoke --rows all
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (printed in one line) or --help
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "run":
            return cmd_run(options.from_args(args, argv[1:]))
        return args.func(args)
    except options.FORESEEN as exc:
        return options.failed(exc)
    except KeyboardInterrupt:  # Ctrl-C before training began (checking flags, reading data, building the model)
        print(
            "interrupted before any run started; nothing was left half-written: run the same command again",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
