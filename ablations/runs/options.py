"""The request of `python -m ablations run`, parsed and checked once into a frozen value before any work.

The runner, the fan-out and the SLURM jobs take a RunOptions; every other command of ablations/ checks its own
values with plumbing/cli.py and reports a foreseen error with `failed`, so that a bad value is one line on stderr and
the exit status says what kind of error it was.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ablations.data.corpora import ENV_VAR, PRESETS, DataError, data_dir
from ablations.runs.budgets import (
    BUDGETS,
    INIT_RULES,
    PRECISIONS,
    SDPA_BACKENDS,
    Budget,
    budget,
    row_config,
    select_rows,
)
from model import SpecError, count_parameters, load_model
from model.config import field_names
from model.registry import ModelSpec, default_spec, lookup, parse_spec
from model.table3 import Table3Row
from plumbing import files
from plumbing.cli import OneLineParser, Once, check_counts, resolve_device
from plumbing.files import StorageError

DEFAULT_RUNS = Path("runs")  # relative to the working directory, like every default path
FORESEEN = (DataError, SpecError, ValueError, StorageError)  # errors a command reports in one line, not a traceback
RESUMES = "run again (finished runs are kept; an unfinished one resumes from its last checkpoint)"


@dataclass(frozen=True)
class RunOptions:
    """What `run` was asked to do, every value checked: the grid, where its data and runs live, how it trains."""

    budget: Budget  # the named budget with --steps, --warmup, --dev-pairs, --lr-peak and --init applied
    rows: tuple[Table3Row, ...]
    seeds: tuple[int, ...]
    spec: ModelSpec
    preset: str
    data: Path  # the data folder (it exists)
    runs: Path  # the runs root (writable)
    device: torch.device
    device_name: str  # --device as given (auto, cpu, cuda, cuda:N): a SLURM job resolves it on its own node
    accumulation: int | None
    max_attempts: int
    threads: int | None
    argv: tuple[str, ...]  # the options as given, after `run`: a resume hint repeats them, the fan-out passes them on
    ddp: bool = False  # data-parallel even as one process under torchrun (ablations/training/distributed.py)


def failed(exc: Exception) -> int:
    """A foreseen error (FORESEEN) as one line on stderr; returns the exit status: 1 for a file that could not be
    written (the disk's fault: the same command may work later), 2 for a bad option or input."""
    storage = isinstance(exc, StorageError)
    print(f"error: {exc.advice('--runs DIR', RESUMES) if storage else exc}", file=sys.stderr)
    return 1 if storage else 2


def parse_seeds(text: str) -> list[int]:
    """'1', '1,2,5' or '1-3': seed numbers 0 or more, each once."""
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ValueError(
                f"--seeds {text!r}: give seed numbers such as 1 or 1,2,3 or 1-3 ({part.strip()!r} is not one)"
            )
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ValueError(f"--seeds {text!r}: the range {part.strip()} is empty; write it upwards ({last}-{first})")
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"--seeds {text!r}: seed {repeated[0]} is given twice; give each seed once")
    return seeds


def budget_with(
    name: str,
    steps: int | None = None,
    warmup: int | None = None,
    dev_pairs: int | None = None,
    lr_peak: float | None = None,
    init: str | None = None,
    compile: bool | None = None,
    sdpa_backend: str | None = None,
    checkpoint_every: int | None = None,
    precision: str | None = None,
    pack: bool | None = None,
) -> Budget:
    """The named budget with the command line's overrides, where given."""
    b = budget(name)
    if precision is not None:
        b = b.replace(precision=precision)
    if pack is not None:
        b = b.replace(pack=pack)
    if checkpoint_every is not None:
        b = b.replace(checkpoint_every=checkpoint_every)
    if compile is not None:
        b = b.replace(compile=compile)
    if sdpa_backend is not None:
        b = b.replace(sdpa_backend=sdpa_backend)
    if steps is not None:
        b = b.replace(steps=steps)
    if warmup is not None:
        b = b.replace(warmup=warmup)
    if dev_pairs is not None:
        b = b.replace(dev_pairs=dev_pairs)
    if lr_peak is not None:
        if not 0 < lr_peak < 1:
            raise ValueError(f"--lr-peak {lr_peak}: give a learning rate between 0 and 1, such as 1e-3")
        b = b.replace(lr_peak=lr_peak)
    if init is not None:
        b = b.replace(init=init)
    return b


def check_runs_folder(runs: Path) -> None:
    """--runs must be a folder this process can write (created if missing): checked by writing a probe file."""
    if runs.exists() and not runs.is_dir():
        raise ValueError(f"--runs {runs}: is a file, not a folder; give a folder (created if missing)")
    try:
        runs.mkdir(parents=True, exist_ok=True)
        probe = files.temporary(runs / ".write-probe")
        files.put_bytes(probe, b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--runs {runs}: cannot write there ({exc.strerror or exc}); give a writable folder") from None


def check_model(parsed: ModelSpec, b: Budget, preset: str, packed: bool = False) -> None:
    """The spec builds the grid's base row and its parameter_groups() work, and takes packed batches where the grid
    trains on them (`packed`); overrides the grid would drop are refused."""
    spec = str(parsed)
    rows_set = sorted(set(parsed.overrides) & set(field_names()))
    if rows_set:
        raise ValueError(
            f"--model {spec}: the grid sets {', '.join(rows_set)} per Table 3 row (every model config field "
            f"comes from the row); drop the override, or choose rows with --rows"
        )
    entry = lookup(parsed.target)
    if entry is not None and entry.takes == "preset" and parsed.variant:
        raise ValueError(
            f"--model {spec}: the grid builds each row's own config, so the preset :{parsed.variant} would "
            f"be ignored; drop it (the big model is --rows big)"
        )
    base = select_rows("base")[0]
    vocab = b.vocab_size or PRESETS[preset].vocab_size
    try:
        model = load_model(parsed, config=row_config(base, b, vocab))
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugged-in model may raise anything on import or construction
        raise ValueError(
            f"--model {spec}: building the model raised {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    try:
        count_parameters(model.parameter_groups())
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"--model {spec}: parameter_groups() raised {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    if packed and not getattr(model, "takes_segments", False):
        raise ValueError(
            f"--model {spec}: budget {b.name} packs several pairs per row on a GPU, which this model cannot take (it "
            "has no takes_segments = True, or replaces the reference's forward, encode or decode); train it one pair "
            "per row with --no-pack, or give it takes_segments and a forward(..., segments=) as model/transformer.py's"
        )


def from_args(args: argparse.Namespace, argv: list[str]) -> RunOptions:
    """Every option of `run`, checked before any work: a one-line ValueError (DataError, SpecError) naming the option,
    its value and what is allowed."""
    check_counts(
        ("--steps", args.steps),
        ("--warmup", args.warmup),
        ("--dev-pairs", args.dev_pairs),
        ("--accumulation", args.accumulation),
        ("--max-attempts", args.max_attempts),
        ("--threads", args.threads),
        ("--checkpoint-every", args.checkpoint_every),
    )
    b = budget_with(
        args.budget,
        args.steps,
        args.warmup,
        args.dev_pairs,
        args.lr_peak,
        args.init,
        args.compile,
        args.sdpa_backend,
        args.checkpoint_every,
        args.precision,
        args.pack,
    )
    if args.accumulation is not None and args.accumulation > b.batch_tokens:
        raise ValueError(
            f"--accumulation {args.accumulation}: at most the budget's {b.batch_tokens} tokens per step "
            f"(each micro-batch holds {b.batch_tokens} / accumulation tokens)"
        )
    rows, seeds, device = select_rows(args.rows), parse_seeds(args.seeds), resolve_device(args.device)
    flag = gpu_only_flag(args)
    if device.type == "cpu" and flag:
        raise ValueError(f"{flag}: used on a GPU only (the CPU runs eager, in fp32); leave it out with --device cpu")
    spec, preset = parse_spec(args.model), args.preset or b.preset
    check_model(spec, b, preset, b.pack and device.type == "cuda")  # named whether or not the data folder is there
    data, runs = data_dir(args.data), Path(args.runs)
    check_runs_folder(runs)
    return RunOptions(
        b,
        tuple(rows),
        tuple(seeds),
        spec,
        preset,
        data,
        runs,
        device,
        args.device,
        args.accumulation,
        args.max_attempts,
        args.threads,
        tuple(argv),
        args.ddp,
    )


def gpu_only_flag(args: argparse.Namespace) -> str | None:
    """The first option given that only a GPU run takes (torch.compile, packing, an attention kernel)."""
    if args.compile:
        return "--compile"
    if args.pack:
        return "--pack"
    if args.sdpa_backend not in (None, "default"):
        return f"--sdpa-backend {args.sdpa_backend}"
    return None


def add_arguments(run: argparse.ArgumentParser) -> None:
    """The options of `run`, each at most once."""
    run.register("action", "once", Once)
    run.add_argument(
        "--budget",
        default="smoke",
        choices=list(BUDGETS),
        action="once",
        help="smoke (CI), cpu (scaled, 2-core CPU), short (one GPU), paper",
    )
    run.add_argument("--rows", default="all", action="once", help="all, or names and groups: base,A,C3 (default all)")
    run.add_argument("--preset", choices=list(PRESETS), action="once", help="data preset (default: the budget's)")
    run.add_argument("--seeds", default="1", action="once", help="seed numbers: 1 or 1,2,3 or 1-3 (default 1)")
    run.add_argument(
        "--model", default=default_spec(), action="once", help="model spec (default $AIAYN_MODEL or reference)"
    )
    run.add_argument("--data", action="once", help=f"data folder (default ${ENV_VAR} or ../shared/data)")
    run.add_argument("--runs", default=str(DEFAULT_RUNS), action="once", help="runs root (default ./runs)")
    run.add_argument("--device", default="auto", action="once", help="auto, cpu, cuda, cuda:N (default auto)")
    run.add_argument(
        "--steps", type=int, action="once", help="override the budget's optimizer steps per row (1 or more)"
    )
    run.add_argument(
        "--warmup", type=int, action="once", help="override the budget's warmup_steps of the learning-rate schedule"
    )
    run.add_argument(
        "--lr-peak",
        type=float,
        action="once",
        help="override the budget's peak learning rate (base's width; wider rows get less, as eq. (3))",
    )
    run.add_argument(
        "--init",
        choices=INIT_RULES,
        action="once",
        help="override the budget's init rule: xavier (own width), paper-width, normal (N(0, 0.02))",
    )
    run.add_argument(
        "--dev-pairs",
        type=int,
        action="once",
        help="score only the first N dev pairs (a quick look; changes the run's hash)",
    )
    run.add_argument(
        "--accumulation", type=int, action="once", help="micro-batches per step (same tokens per step, less memory)"
    )
    run.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the model on a GPU (default: the budget's, on for short and paper)",
    )
    run.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        help="several sentence pairs per row on a GPU, for little padding (default: the budget's, on for short and "
        "paper)",
    )
    run.add_argument(
        "--sdpa-backend",
        choices=SDPA_BACKENDS,
        action="once",
        help="the attention kernel on a GPU (default: efficient; 'default' lets torch choose)",
    )
    run.add_argument(
        "--precision",
        choices=PRECISIONS,
        action="once",
        help="bf16-weights (a GPU's default: bf16 weights and activations, fp32 master weights), bf16 (autocast) or "
        "fp32 (the CPU's default; a bf16 precision there is slower, for cross-checks)",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        action="once",
        help="override the budget's steps between checkpoints (the last step is always saved; changes the run's hash)",
    )
    run.add_argument(
        "--ddp",
        action="store_true",
        help="under torchrun, train data-parallel (process group, DDP, all-reduces) even as one process",
    )
    run.add_argument(
        "--max-attempts", type=int, default=3, action="once", help="failed runs are retried until this many attempts"
    )
    run.add_argument(
        "--threads",
        type=int,
        action="once",
        help="CPU threads per process (default $OMP_NUM_THREADS, else 1 up to d_model 128, else the free cores)",
    )


def parse(argv: list[str]) -> RunOptions:
    """The options of `run` (what follows `python -m ablations run`), parsed and checked; a usage mistake exits with
    status 2 in one line, as the runner's own."""
    parser = OneLineParser(prog="python -m ablations run")
    add_arguments(parser)
    return from_args(parser.parse_args(argv), argv)
