"""python -m ablations.runs.curves RUNS [--follow] [--out DIR]: the runs' logged metrics as TensorBoard curves.

Each run folder under RUNS (a grid's folder, a runs root, or one run) becomes one TensorBoard run, named by its
folder, so that `tensorboard --logdir DIR` shows a whole grid on one board. The scalars are what metrics.jsonl holds
(folder.py lists its keys), by step; once the run has ended, final.json's scores and rates at its last step, and an
MFU curve: the runner reports MFU in final.json only, and MFU is proportional to the token rate (model FLOPs per
token x tokens/s over the card's peak), so a logged window's MFU is its tokens/s x final.json's mfu / tokens_per_s.

The reading is pure Python (`read_new`, `scalars`, `Converter` with any `Writer`); only `TensorBoardWriter` needs
tensorboard (the curves extra), imported when the command starts, so the runner and the tests never need it.
Re-running converts only what is new: each run keeps, beside its event files, how far it has read metrics.jsonl and
the last step written. A line still being written (no newline yet) waits for the next pass; a damaged line is a
one-line warning. A resumed run rewrites metrics.jsonl back to its checkpoint and logs those steps again: they are
skipped, as already written, so every step appears once. `--follow` converts every few seconds until Ctrl-C or
SIGTERM, which end it after the pass under way (plumbing/stopping.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Protocol

from ablations.runs.folder import CONFIG, FINAL, METRICS, read_json, read_metrics, run_folders, warn, write_json
from plumbing import cli, stopping
from plumbing.files import StorageError, writable_folder

STATE = "curves-state.json"  # beside a TensorBoard run's event files (TensorBoard reads only *tfevents* files)
# metrics.jsonl's keys (ablations/runs/folder.py) and their tags; another number a later runner logs gets "other/KEY".
TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "tokens_per_s": "train/tokens_per_s",
    "dev_ppl": "dev/ppl",
    "time_s": "time/train_s",
    "step_s_p50": "time/step_s_p50",
    "step_s_max": "time/step_s_max",
    "step_s_max_all": "time/step_s_max_all",
    "compile_s": "time/compile_s",
    "compiles": "time/compiles",
}
MFU = "train/mfu"
FINAL_KEYS = ("dev_ppl", "bleu", "bleu_tokenized", "tokens_per_s", "mfu", "wall_tokens_per_s", "wall_mfu")


class Scalar(NamedTuple):
    """One point of one curve: TensorBoard's tag, the training step, the value."""

    tag: str
    step: int
    value: float


@dataclass(frozen=True)
class State:
    """How far one run has been converted: the bytes of metrics.jsonl read, the last line read (to see the file was
    not rewritten since), the lines read, the last step written, and a hash of the final.json written ("" for none)."""

    offset: int = 0
    tail: str = ""
    lines: int = 0
    step: int = 0
    final: str = ""


def is_number(value: object) -> bool:
    """Whether a JSON value is a number (true and false are not, though Python counts them as ints)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalars(record: dict) -> list[Scalar]:
    """A metrics.jsonl record's numbers as scalars at its step; null (not measured, or not finite) and flags such as
    "stopped" are left out."""
    step = record["step"]
    return [
        Scalar(TAGS.get(key, f"other/{key}"), step, float(value))
        for key, value in record.items()
        if key != "step" and is_number(value)
    ]


def final_scalars(final: dict, records: Iterable[dict]) -> list[Scalar]:
    """final.json's scores and rates at the run's last step, and each record's MFU where final.json has one."""
    step = final.get("steps")
    if not isinstance(step, int) or isinstance(step, bool):
        return []
    found = [Scalar(f"final/{key}", step, float(final[key])) for key in FINAL_KEYS if is_number(final.get(key))]
    mfu, rate = final.get("mfu"), final.get("tokens_per_s")
    if is_number(mfu) and is_number(rate) and rate > 0:
        found += [
            Scalar(MFU, r["step"], r["tokens_per_s"] * mfu / rate) for r in records if is_number(r.get("tokens_per_s"))
        ]
    return found


def parse_line(line: bytes) -> dict | None:
    """A metrics record (a JSON object with a whole-number step), or None for anything else."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("step"), int) and not isinstance(record["step"], bool)
    return record if ok else None


def read_new(path: Path, state: State) -> tuple[list[dict], State]:
    """The records of metrics.jsonl not yet converted, and the state after them.

    Reading goes on from state.offset while the line before it is still state.tail; otherwise (the runner rewrote the
    file when a run resumed) from the start. Either way only records past state.step are new. A last line with no
    newline is still being written: it is left for the next pass. A damaged line is skipped with a warning."""
    tail = state.tail.encode()
    try:
        with open(path, "rb") as f:
            start = state.offset - len(tail)
            f.seek(max(start, 0))
            same = start >= 0 and state.offset > 0 and f.read(len(tail)) == tail
            if not same:
                f.seek(0)
                state = replace(state, offset=0, tail="", lines=0)
            data = f.read()
    except FileNotFoundError:  # not logged yet
        return [], state
    except OSError as exc:
        warn(f"cannot read {path}: {exc.strerror or exc}; trying again next pass")
        return [], state
    complete = data[: data.rfind(b"\n") + 1]
    records, step, lines = [], state.step, [line + b"\n" for line in complete.split(b"\n")[:-1]]
    for number, line in enumerate(lines, state.lines + 1):
        if not line.strip():
            continue
        record = parse_line(line)
        if record is None:
            warn(f"{path} line {number}: not a metrics record (damaged?), skipped")
        elif record["step"] > step:
            records.append(record)
            step = record["step"]
    if not lines:
        return records, state
    last = lines[-1].decode(errors="replace")
    return records, State(state.offset + len(complete), last, state.lines + len(lines), step, state.final)


def fingerprint(path: Path) -> str:
    """A hash of a file's bytes ("" when it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


class Writer(Protocol):
    """Where one run's scalars go: a TensorBoard run, or a list in the tests."""

    def write(self, found: list[Scalar]) -> None: ...

    def close(self) -> None: ...


class TensorBoardWriter:
    """One TensorBoard run: an event file in `log_dir`, flushed after each write."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.summary = SummaryWriter(log_dir=str(log_dir))

    def write(self, found: list[Scalar]) -> None:
        for tag, step, value in found:
            self.summary.add_scalar(tag, value, step)
        self.summary.flush()

    def close(self) -> None:
        self.summary.close()


def check_tensorboard() -> None:
    """A one-line ValueError when tensorboard is not installed, before any work."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ValueError(
            "the curves need tensorboard, which comes with the curves extra: pip install -e '.[curves]' "
            "(or run them as nox -s curves -- RUNS)"
        ) from None


class Converter:
    """The run folders under `runs`, each as one TensorBoard run under `out` (named by its folder's path below
    `runs`), brought up to date by `update`; `open_writer` makes a run's writer when it first has scalars."""

    def __init__(self, runs: Path, out: Path, open_writer: Callable[[Path], Writer]) -> None:
        self.runs, self.out, self.open_writer = runs, out, open_writer
        self.writers: dict[Path, Writer] = {}

    def name(self, directory: Path) -> str:
        """A run's TensorBoard name: its folder's path below `runs` (its folder's name when `runs` is the run)."""
        return directory.name if directory == self.runs else directory.relative_to(self.runs).as_posix()

    def update(self) -> int:
        """Convert what every run logged since the last update; returns the scalars written."""
        return sum(self.update_run(directory) for directory in run_folders(self.runs, CONFIG))

    def update_run(self, directory: Path) -> int:
        """Write one run's new scalars, then save how far it has been read; returns how many were written."""
        log_dir = self.out / self.name(directory)
        saved = read_json(log_dir / STATE)
        try:
            state = State(**saved) if saved else State()
        except TypeError:  # a state file of another shape: convert the run again
            state = State()
        records, state = read_new(directory / METRICS, state)
        found = [s for r in records for s in scalars(r)]
        final = read_json(directory / FINAL)
        done = fingerprint(directory / FINAL) if final else ""
        if final and done != state.final:
            found += final_scalars(final, read_metrics(directory))
            state = replace(state, final=done)
        if found:
            if log_dir not in self.writers:
                self.writers[log_dir] = self.open_writer(log_dir)
            self.writers[log_dir].write(found)
        if asdict(state) != (saved or asdict(State())):
            log_dir.mkdir(parents=True, exist_ok=True)
            write_json(log_dir / STATE, asdict(state))
        return len(found)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


def follow(converter: Converter, every: float | None) -> int:
    """Update once, or (every: seconds) again and again until a stop signal; a signal during an update takes effect
    after it, so a run's event file and its state never disagree. Returns the exit status."""
    written = 0
    with stopping.graceful_stops():
        try:
            while True:
                with stopping.step():
                    written += converter.update()
                if stopping.requested():
                    raise stopping.Stopped(stopping.requested())
                if every is None:
                    break
                time.sleep(every)
        except stopping.Stopped as stop:
            print(f"{stop}: {written} scalars written; run again to go on", file=sys.stderr)
            return stop.exit_status
        finally:
            converter.close()
    print(f"{written} scalars written to {converter.out}: tensorboard --logdir {converter.out}", file=sys.stderr)
    return 0


def default_out(runs: Path) -> Path:
    """tensorboard/ in the grid's folder (the folder above, for one run), beside its runs."""
    return (runs.parent if (runs / CONFIG).is_file() else runs) / "tensorboard"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line; a mistake is one line (plumbing/cli.py)."""
    parser = cli.OneLineParser(
        prog="python -m ablations.runs.curves", description="The runs' logged metrics as TensorBoard curves."
    )
    parser.add_argument("runs", type=Path, help="a runs folder: a grid's, a runs root, or one run's")
    parser.add_argument(
        "--out",
        type=Path,
        action=cli.Once,
        help="where the event files go (default: tensorboard/ in the grid's folder)",
    )
    parser.add_argument("--follow", action="store_true", help="convert again every few seconds until Ctrl-C")
    parser.add_argument("--every", type=float, default=5.0, action=cli.Once, help="seconds between passes (--follow)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Check the arguments and that tensorboard is there, then convert (once, or following); returns the exit status."""
    args = parse(argv)
    try:
        if not args.runs.is_dir():
            raise ValueError(f"runs folder {args.runs} not found; give the folder a grid writes to (--runs of run)")
        if not args.every > 0:
            raise ValueError(f"--every {args.every}: give a number of seconds above 0")
        if not args.follow and not run_folders(args.runs, CONFIG):
            raise ValueError(f"no run folders (with {CONFIG}) under {args.runs}; run the grid first")
        out = writable_folder(args.out or default_out(args.runs))
        check_tensorboard()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.follow:
        print(f"following {args.runs} into {out} (tensorboard --logdir {out}); Ctrl-C stops", file=sys.stderr)
    try:
        return follow(Converter(args.runs, out, TensorBoardWriter), args.every if args.follow else None)
    except (StorageError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
