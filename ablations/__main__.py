"""python -m ablations run | results | publish  (also: nox -s ablations -- run ...; `run` may be left out)."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from ablations import runs as R
from ablations.budgets import BUDGETS, Budget, budget, select_rows
from ablations.data import ENV_VAR, PRESETS, DataError, data_dir
from ablations.distributed import check_accumulation, from_environment, main_first, setup, teardown
from ablations.grid import REPO_ROOT, Grid, prepare_data, run_grid
from model import SpecError, load_model
from model.registry import default_spec

DEFAULT_RUNS = REPO_ROOT / "runs"


def parse_seeds(text: str) -> list[int]:
    """'1', '1,2,5' or '1-3'."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            seeds.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise ValueError(f"--seeds {text!r}: give seed numbers such as 1 or 1,2,3 or 1-3") from None
    return seeds


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available; use --device cpu")
    return torch.device(name)


def budget_from(args: argparse.Namespace) -> Budget:
    """The named budget with the command line's --steps, --warmup and --dev-pairs, where given."""
    b = budget(args.budget)
    if args.steps is not None:
        b = b.replace(steps=args.steps)
    if getattr(args, "warmup", None) is not None:
        b = b.replace(warmup=args.warmup)
    if getattr(args, "dev_pairs", None) is not None:
        b = b.replace(dev_pairs=args.dev_pairs)
    return b


def cmd_run(args: argparse.Namespace) -> int:
    """The grid in this process, or data-parallel over the processes torchrun started (ablations/distributed.py)."""
    b = budget_from(args)
    rows = select_rows(args.rows)
    seeds = parse_seeds(args.seeds)
    preset = args.preset or b.preset
    ranks = from_environment()
    check_accumulation(args.accumulation or b.accumulation, ranks)
    device = resolve_device(args.device)
    load_model(args.model)  # a bad spec fails here, in one line, before any data is read
    device = setup(ranks, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    data = main_first(ranks, lambda: prepare_data(b, preset, data_dir(args.data), Path(args.runs)))
    scaled = f" (SCALED: sizes / {b.scale})" if b.scaled else ""
    parallel = f" x {ranks.world} data-parallel processes" if ranks.parallel else ""
    if ranks.main:
        print(f"budget {b.name}{scaled}, {len(rows)} rows x {len(seeds)} seeds, model {args.model}, device {device}{parallel}; "
              f"{data.summary}", file=sys.stderr)
    grid = Grid(b, rows, seeds, args.model, Path(args.runs), device, args.accumulation, args.max_attempts, ranks)
    try:
        outcomes = run_grid(grid, data)
    finally:
        teardown()
    if not ranks.main:
        return 0
    print(R.summary([d for d, _ in outcomes]), file=sys.stderr)
    return 1 if any(status == "failed" for _, status in outcomes) else 0


def cmd_results(args: argparse.Namespace) -> int:
    table = R.results_table(Path(args.runs))
    if table.empty:
        raise ValueError(f"no final.json under {args.runs}; run the grid first: python -m ablations run --budget smoke")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        try:
            table.to_parquet(out, index=False)
        except ImportError:
            raise ValueError(f"writing {out} needs pyarrow (pip install pyarrow), or ask for a .csv file") from None
    else:
        R.write_atomic(out, table.to_csv(index=False))
    print(f"{len(table)} runs -> {out}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    """Copy a budget's results (no checkpoints) under reports/results/<budget>/ for readers."""
    source = Path(args.runs) / args.budget
    finals = sorted(source.glob(f"*/{R.FINAL}"))
    if not finals:
        raise ValueError(f"no finished runs under {source}; run: python -m ablations run --budget {args.budget}")
    target = Path(args.out or REPO_ROOT / "reports" / "results" / args.budget)
    for final in finals:
        dest = target / "runs" / final.parent.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in R.PUBLISHED:
            if (final.parent / name).is_file():  # a run that failed before training has no metrics
                shutil.copyfile(final.parent / name, dest / name)
    table = R.results_table(target / "runs")
    R.write_atomic(target / "results.csv", table.to_csv(index=False))
    print(f"{len(finals)} runs -> {target}/results.csv and {target}/runs/")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ablations", description="Train and score the rows of the paper's Table 3.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and score a grid of rows (resumes, skips finished runs)")
    run.add_argument("--budget", default="smoke", choices=list(BUDGETS), help="smoke (scaled, CPU), short (one GPU), paper")
    run.add_argument("--rows", default="all", help="all, or names and groups: base,A,C3 (default all)")
    run.add_argument("--preset", choices=list(PRESETS), help="data preset (default: the budget's)")
    run.add_argument("--seeds", default="1", help="seed numbers: 1 or 1,2,3 or 1-3 (default 1)")
    run.add_argument("--model", default=default_spec(), help="model spec (default $AIAYN_MODEL or reference)")
    run.add_argument("--data", help=f"data folder (default ${ENV_VAR} or <repo>/../shared/data)")
    run.add_argument("--runs", default=str(DEFAULT_RUNS), help="runs root (default <repo>/runs)")
    run.add_argument("--device", default="auto", help="auto, cpu, cuda (default auto)")
    run.add_argument("--steps", type=int, help="override the budget's optimizer steps per row")
    run.add_argument("--warmup", type=int, help="override the budget's warmup_steps of the learning-rate schedule")
    run.add_argument("--dev-pairs", type=int, help="score only the first N dev pairs (a quick look; changes the run's hash)")
    run.add_argument("--accumulation", type=int, help="micro-batches per step (same tokens per step, less memory)")
    run.add_argument("--max-attempts", type=int, default=3, help="failed runs are retried until this many attempts")
    run.set_defaults(func=cmd_run)
    res = sub.add_parser("results", help="gather every final.json under --runs into one table")
    res.add_argument("--runs", default=str(DEFAULT_RUNS))
    res.add_argument("--out", default="results.csv", help="FILE.csv or FILE.parquet (needs pyarrow)")
    res.set_defaults(func=cmd_results)
    pub = sub.add_parser("publish", help="copy a budget's results (no checkpoints) to reports/results/<budget>/")
    pub.add_argument("--budget", default="smoke", choices=list(BUDGETS))
    pub.add_argument("--runs", default=str(DEFAULT_RUNS))
    pub.add_argument("--out", help="target folder (default reports/results/<budget>)")
    pub.set_defaults(func=cmd_publish)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("--") and argv[0] != "--help":
        argv = ["run", *argv]  # the form: python -m ablations --budget smoke --rows all
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (DataError, SpecError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
