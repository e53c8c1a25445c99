"""python -m ablations run | results | publish  (also: nox -s ablations -- run ...; `run` may be left out)."""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import torch

from ablations import attention_data
from ablations import runs as R
from ablations.budgets import BUDGETS, INIT_RULES, Budget, budget, row_config, select_rows
from ablations.data import ENV_VAR, PRESETS, DataError, data_dir
from ablations.distributed import check_accumulation, from_environment, main_first, setup, teardown
from ablations.grid import Grid, prepare_data, run_grid
from ablations.stopping import Stopped, graceful_stops
from ablations.throughput import choose_threads
import invariants.mutants  # noqa: F401  (registers mutant:NAME, so --model mutant:NAME trains a broken model)
from model import SpecError, count_parameters, load_model
from model.config import field_names
from model.registry import ModelSpec, default_spec, lookup, parse_spec

DEFAULT_RUNS = Path("runs")  # relative to the working directory, like every default path


def parse_seeds(text: str) -> list[int]:
    """'1', '1,2,5' or '1-3': seed numbers 0 or more, each once."""
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ValueError(f"--seeds {text!r}: give seed numbers such as 1 or 1,2,3 or 1-3 ({part.strip()!r} is not one)")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ValueError(f"--seeds {text!r}: the range {part.strip()} is empty; write it upwards ({last}-{first})")
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"--seeds {text!r}: seed {repeated[0]} is given twice; give each seed once")
    return seeds


def resolve_device(name: str) -> torch.device:
    """auto, cpu, cuda or cuda:N; anything else is a one-line error listing what is allowed."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", name)
    if not match:
        raise ValueError(f"--device {name!r}: give auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available; use --device cpu")
    if match[1] is not None and int(match[1]) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
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
    if getattr(args, "lr_peak", None) is not None:
        if not 0 < args.lr_peak < 1:
            raise ValueError(f"--lr-peak {args.lr_peak}: give a learning rate between 0 and 1, such as 1e-3")
        b = b.replace(lr_peak=args.lr_peak)
    if getattr(args, "init", None) is not None:
        b = b.replace(init=args.init)
    return b


def check_runs_folder(runs: Path) -> None:
    """--runs must be a folder this process can write (created if missing): checked by writing a probe file."""
    if runs.exists() and not runs.is_dir():
        raise ValueError(f"--runs {runs}: is a file, not a folder; give a folder (created if missing)")
    try:
        runs.mkdir(parents=True, exist_ok=True)
        probe = R.temporary(runs / ".write-probe")
        R.put_bytes(probe, b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--runs {runs}: cannot write there ({exc.strerror or exc}); give a writable folder") from None


def check_model(parsed: ModelSpec, b: Budget, preset: str) -> None:
    """The spec builds the grid's base row and its parameter_groups() work; overrides the grid would drop are refused."""
    spec = str(parsed)
    rows_set = sorted(set(parsed.overrides) & set(field_names()))
    if rows_set:
        raise ValueError(f"--model {spec}: the grid sets {', '.join(rows_set)} per Table 3 row (every model config field "
                         f"comes from the row); drop the override, or choose rows with --rows")
    entry = lookup(parsed.target)
    if entry is not None and entry.takes == "preset" and parsed.variant:
        raise ValueError(f"--model {spec}: the grid builds each row's own config, so the preset :{parsed.variant} would "
                         f"be ignored; drop it (the big model is --rows big)")
    base = select_rows("base")[0]
    vocab = b.vocab_size or PRESETS[preset].vocab_size
    try:
        model = load_model(parsed.with_config(row_config(base, b, vocab)))
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugged-in model may raise anything on import or construction
        raise ValueError(f"--model {spec}: building the model raised {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    try:
        count_parameters(model.parameter_groups())
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"--model {spec}: parameter_groups() raised {type(exc).__name__}: {' '.join(str(exc).split())}") from None


def check_counts(*flags: tuple[str, int | None]) -> None:
    """A one-line ValueError for the first (flag, value) whose value is below 1 (None: not given, fine)."""
    for flag, value in flags:
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: give a whole number of at least 1")


def check_run_args(args: argparse.Namespace) -> Budget:
    """Every option of `run`, checked before any work: a one-line ValueError naming the option, its value and what is allowed."""
    check_counts(("--steps", args.steps), ("--warmup", args.warmup), ("--dev-pairs", args.dev_pairs),
                 ("--accumulation", args.accumulation), ("--max-attempts", args.max_attempts), ("--threads", args.threads))
    b = budget_from(args)
    if args.accumulation is not None and args.accumulation > b.batch_tokens:
        raise ValueError(f"--accumulation {args.accumulation}: at most the budget's {b.batch_tokens} tokens per step "
                         f"(each micro-batch holds {b.batch_tokens} / accumulation tokens)")
    select_rows(args.rows)
    parse_seeds(args.seeds)
    resolve_device(args.device)
    data_dir(args.data)
    check_runs_folder(Path(args.runs))
    check_model(parse_spec(args.model), b, args.preset or b.preset)
    return b


def resume_hint(argv: list[str]) -> str:
    return "python -m ablations " + shlex.join(argv)


def cmd_run(args: argparse.Namespace) -> int:
    """The grid in this process, or data-parallel over the processes torchrun started (ablations/distributed.py)."""
    b = check_run_args(args)
    rows = select_rows(args.rows)
    seeds = parse_seeds(args.seeds)
    preset = args.preset or b.preset
    ranks = from_environment()
    check_accumulation(args.accumulation or b.accumulation, ranks)
    device = resolve_device(args.device)
    with graceful_stops():
        try:
            device = setup(ranks, device)
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            else:  # one thread for the scaled models unless asked (ablations/throughput.py says why)
                torch.set_num_threads(choose_threads(row_config(rows[0], b, vocab_size=1), args.threads))
            data = main_first(ranks, lambda: prepare_data(b, preset, data_dir(args.data), Path(args.runs)))
            scaled = f" (SCALED: sizes / {b.scale})" if b.scaled else ""
            parallel = f" x {ranks.world} data-parallel processes" if ranks.parallel else ""
            if ranks.main:
                print(f"budget {b.name}{scaled}, {len(rows)} rows x {len(seeds)} seeds, model {args.model}, device {device}{parallel}; "
                      f"{data.summary}", file=sys.stderr)
            grid = Grid(b, rows, seeds, parse_spec(args.model), Path(args.runs), device, args.accumulation, args.max_attempts, ranks)
            outcomes = run_grid(grid, data)
        except Stopped as stop:
            if ranks.main:
                print(f"{stop}; finished runs are kept; resume with: {resume_hint(args.argv)}", file=sys.stderr)
            return stop.exit_status
        except R.StorageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            teardown()
    if not ranks.main:
        return 0
    print(R.summary([d for d, _ in outcomes], {d for d, s in outcomes if s == R.BUSY}), file=sys.stderr)
    return 1 if any(status == "failed" for _, status in outcomes) else 0


def cmd_results(args: argparse.Namespace) -> int:
    table = R.results_table(Path(args.runs))
    if table.empty:
        found = next(Path(args.runs).rglob(R.FINAL), None)
        raise ValueError(f"no readable final.json under {args.runs}" + (" (damaged ones skipped, see above)" if found else "")
                         + "; run the grid first: python -m ablations run --budget smoke")
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
        R.write_atomic(out, table.to_csv(index=False))
    print(f"{len(table)} runs -> {out}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    """Copy a budget's results (no checkpoints) under reports/results/<budget>/ for readers."""
    source = Path(args.runs) / args.budget
    finals = [path for path, _ in R.ended_results(source)] if source.is_dir() else []
    if not finals:
        raise ValueError(f"no finished runs under {source}; run: python -m ablations run --budget {args.budget}")
    target = Path(args.out or Path("reports") / "results" / args.budget)
    for final in finals:
        dest = target / "runs" / final.parent.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in R.PUBLISHED:
            if (final.parent / name).is_file():  # a run that failed before training has no metrics
                shutil.copyfile(final.parent / name, dest / name)
    table = R.results_table(target / "runs")
    R.write_atomic(target / "results.csv", table.to_csv(index=False))
    print(f"{len(finals)} runs -> {target}/results.csv and {target}/runs/")
    try:  # the attention figure's data from the trained base model (its weights stay in the runs folder)
        R.write_atomic(target / attention_data.PUBLISHED, json.dumps(attention_data.extract(source, decimals=4)))
        print(f"base's encoder attention -> {target / attention_data.PUBLISHED}")
    except attention_data.NoAttentionData as missing:
        print(f"no attention figure data: {missing}")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes as one line naming the option and what is allowed (exit status 2), not argparse's usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Once(argparse.Action):
    """An option given twice is an error, not silently its last value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        seen = namespace.__dict__.setdefault("_given", set())
        if self.dest in seen:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)!r} and {values!r}); give it once")
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations", description="Train and score the rows of the paper's Table 3.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and score a grid of rows (resumes, skips finished runs)")
    run.register("action", "once", Once)
    run.add_argument("--budget", default="smoke", choices=list(BUDGETS), action="once", help="smoke (CI), cpu (scaled, 2-core CPU), short (one GPU), paper")
    run.add_argument("--rows", default="all", action="once", help="all, or names and groups: base,A,C3 (default all)")
    run.add_argument("--preset", choices=list(PRESETS), action="once", help="data preset (default: the budget's)")
    run.add_argument("--seeds", default="1", action="once", help="seed numbers: 1 or 1,2,3 or 1-3 (default 1)")
    run.add_argument("--model", default=default_spec(), action="once", help="model spec (default $AIAYN_MODEL or reference)")
    run.add_argument("--data", action="once", help=f"data folder (default ${ENV_VAR} or ../shared/data)")
    run.add_argument("--runs", default=str(DEFAULT_RUNS), action="once", help="runs root (default ./runs)")
    run.add_argument("--device", default="auto", action="once", help="auto, cpu, cuda, cuda:N (default auto)")
    run.add_argument("--steps", type=int, action="once", help="override the budget's optimizer steps per row (1 or more)")
    run.add_argument("--warmup", type=int, action="once", help="override the budget's warmup_steps of the learning-rate schedule")
    run.add_argument("--lr-peak", type=float, action="once",
                     help="override the budget's peak learning rate (base's width; wider rows get less, as eq. (3))")
    run.add_argument("--init", choices=INIT_RULES, action="once",
                     help="override the budget's init rule: xavier (own width), paper-width, normal (N(0, 0.02))")
    run.add_argument("--dev-pairs", type=int, action="once", help="score only the first N dev pairs (a quick look; changes the run's hash)")
    run.add_argument("--accumulation", type=int, action="once", help="micro-batches per step (same tokens per step, less memory)")
    run.add_argument("--max-attempts", type=int, default=3, action="once", help="failed runs are retried until this many attempts")
    run.add_argument("--threads", type=int, action="once",
                     help="CPU threads per process (default $OMP_NUM_THREADS, else 1 up to d_model 128, else the free cores)")
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
        argv = ["run", *argv]  # the short form: python -m ablations --budget smoke --rows all
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (printed in one line) or --help
        return exc.code if isinstance(exc.code, int) else 2
    args.argv = argv
    try:
        return args.func(args)
    except (DataError, SpecError, ValueError, R.StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, R.StorageError) else 1
    except KeyboardInterrupt:  # Ctrl-C before training began (checking flags, reading data, building the model)
        print("interrupted before any run started; nothing was left half-written: run the same command again", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
