"""`python -m ablations.bench.check --data gpu-data --out DIR`: what one GPU must show, in at most 8 minutes.

Beforehand, on a CPU: `--prepare gpu-data` copies the corpora and builds the BPE and encoded sets the parts use
(ablations/bench/check/prepare.py), so that no GPU minute trains a tokenizer. On the GPU, four parts, each a process
(or a few, in stages) under its own time limit, each reported whether or not another failed:

    bench     the GPU benchmark at the base size (python -m ablations.bench.gpu), a step profiled              170 s
    runner    300 steps of the short budget's base row through the runner, recompiles logged, scoring          165 s
    torchrun  the smoke budget's row D1 under torchrun, forced through DDP and the all-reduce at world 1        45 s
    tests     the CUDA-only tests, then (best effort) the device-sensitive ones and the rest                    80 s

460 s in all, with the check's own start and report inside the 8 minutes. Everything is written into the --out
folder as soon as it exists: gpu-check.md and .json after each part, the bench's report, each part's log, the runs'
records; files of an earlier check there are moved into earlier-<date>/ first. `--parts runner,tests` runs some
parts (a rerun in what is left of a GPU loan); `--device cpu` runs the same parts on a CPU (at full sizes they are
cut at their limits, and still report), `--quick` at tiny sizes in about a minute.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ablations.bench.check import prepare
from ablations.bench.check.report import (
    BENCH,
    BROKEN_SO_FAR,
    OUT,
    WORK,
    bench_lines,
    epoch,
    recompile_lines,
    runner_lines,
    records,
    tail,
    targets,
    tests_lines,
    write_report,
)
from ablations.bench.check.parts import Outcome, Part, Stage, become_subreaper, run_part, utc_now
from ablations.bench.report import SHOWN_AS, machine, shown_args
from ablations.data.corpora import data_dir
from ablations.grid.runner import describe_device
from ablations.runs.options import FORESEEN, failed
from ablations.training.peaks import peak
from plumbing.cli import OneLineParser, resolve_device
from plumbing.files import writable_folder
from plumbing.stopping import stops_cleanly

REPO = Path(__file__).resolve().parents[3]
LIMITS = {"bench": 170, "runner": 165, "torchrun": 45, "tests": 80}  # seconds; 460 in all
QUICK_LIMIT = 60  # each part of --quick
RUNNER = {"runner": ("short", "base"), "torchrun": ("smoke", "D1")}  # the (budget, row) each run part trains
# The tests whose outcome depends on the device: training and its clock, the GPU path, the invariants on a device.
# The files that hold the tests marked cuda (tests.helpers.needs_cuda): the first stage collects only these.
CUDA_TESTS = (
    "tests/ablations/test_sync.py",
    "tests/invariants/test_device.py",
    "tests/ablations/test_prefetch.py",
    "tests/model/test_gpu_paths.py",
    "tests/ablations/test_precision.py",
    "tests/model/test_packing.py",
    "tests/ablations/test_step_graphs.py",
)
DEVICE_TESTS = (
    "tests/ablations/test_gpu_path.py",
    "tests/ablations/test_train.py",
    "tests/ablations/test_distributed.py",
    "tests/invariants/test_device.py",
)


@dataclass(frozen=True)
class CheckOptions:
    device: str  # as given: the parts resolve it themselves
    quick: bool
    data: prepare.CheckData
    work: Path
    keep: bool  # the work folder was given: it stays
    out: Path  # the folder every report and log goes to
    pytest_args: tuple[str, ...]  # empty: the tests part's stages
    args: str
    parts: tuple[str, ...] = tuple(LIMITS)  # which of the four run (--parts), in their order


def runner_budget(o: CheckOptions) -> tuple[str, str]:
    """The (budget, row) the runner part trains: short's base on a GPU, smoke's with --quick."""
    return ("smoke", "base") if o.quick else RUNNER["runner"]


def tests_stages(o: CheckOptions) -> tuple[Stage, ...]:
    """The CUDA-only tests first and always, then the device-sensitive ones, then the rest of the suite if time
    remains (these two best effort: cut at the limit, they fail nothing), each stage over up to 8 processes where
    pytest-xdist is installed (one per core)."""
    pytest = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    if o.pytest_args:
        return (Stage("tests", (sys.executable, "-m", "pytest", *o.pytest_args)),)
    if o.quick:
        return (Stage("cuda-only", (*pytest, "-m", "cuda", "tests/invariants/test_device.py")),)
    workers = min(8, os.cpu_count() or 1)  # more processes than cores only slows each (a 2-core CPU: 2)
    spread = ("-n", str(workers)) if importlib.util.find_spec("xdist") and workers > 1 else ()
    ignored = tuple(f"--ignore={path}" for path in DEVICE_TESTS)
    return (
        Stage("cuda-only", (*pytest, *spread, "-m", "cuda", *CUDA_TESTS)),
        Stage("device-sensitive", (*pytest, *spread, "-m", "not cuda", *DEVICE_TESTS), min_s=20, best_effort=True),
        Stage("the rest", (*pytest, *spread, "-m", "not cuda", *ignored, "tests"), min_s=60, best_effort=True),
    )


def plan(o: CheckOptions) -> list[Part]:
    """The parts that --parts selects (with --quick, their tiny versions)."""
    py = sys.executable
    common = ("--device", o.device, "--data", str(o.data.corpora), "--runs", str(o.work / "runs"))
    run = ("-m", "ablations", "run")
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1")
    limits = dict.fromkeys(LIMITS, QUICK_LIMIT) if o.quick else LIMITS
    budget, row = runner_budget(o)
    if o.quick:
        sizes = ("--sizes", "tiny", "--steps", "3", "--warmup", "1", "--decode-reps", "1", "--time-limit", "30")
        sizes += ("--backends", "default,cudnn")  # the CPU has no cuDNN: the unsupported path, reported
        short = ("--budget", budget, "--rows", row, "--steps", "8", "--dev-pairs", "10")
        smoke = ("--budget", "smoke", "--rows", "D1", "--steps", "4", "--dev-pairs", "10")
    else:
        sizes = ("--sizes", "base", "--steps", "10", "--warmup", "2", "--decode-sentences", "16", "--decode-reps", "2")
        sizes += ("--batch-tokens", "25000")  # the paper's batch (section 5.1), which the step's targets are set at
        sizes += ("--time-limit", str(LIMITS["bench"] - 30))  # counted from the data being ready: room for the rest
        short = ("--budget", budget, "--rows", row, "--steps", "300", "--dev-pairs", "100")
        smoke = ("--budget", "smoke", "--rows", "D1", "--dev-pairs", "20")
    short += ("--checkpoint-every", "1000")  # the last step's only (0.6 GB), outside the step clock as every save
    distributed = "" if torch.distributed.is_available() else "skipped: this torch has no torch.distributed"
    encoded = o.data.encoded or o.work / "prepared"  # not prepared: the bench prepares its data there, off its clock
    bench = (
        py,
        "-m",
        "ablations.bench.gpu",
        *sizes,
        *common,
        "--prepared",
        str(encoded),
        "--out",
        str(o.out / f"{BENCH}.md"),
    )
    names = {SHOWN_AS: os.pathsep.join((f"{WORK}={o.work}", f"{OUT}={o.out}"))}  # no machine's folders in reports
    data_env = {"AIAYN_DATA": str(o.data.corpora), **names}  # the tests that read the corpora run, not skip
    parts = [
        Part("bench", "the GPU benchmark", (Stage("bench", bench),), limits["bench"], env=names),
        Part(
            "runner",
            "the runner, one row",
            (Stage("runner", (py, *run, *short, *common)),),
            limits["runner"],
            env={**names, "TORCH_LOGS": "recompiles"},  # each recompile and the guard that failed, into its log
        ),
        Part(
            "torchrun",
            "the runner under torchrun, through DDP",
            (Stage("torchrun", (py, *torchrun, *run, *smoke, "--ddp", *common)),),
            limits["torchrun"],
            distributed,
            env=names,
        ),
        # SIGINT: pytest stops as on Ctrl-C and still prints its summary, the failures so far by name.
        Part("tests", "the test suite", tests_stages(o), limits["tests"], "", signal.SIGINT, data_env),
    ]
    return [part for part in parts if part.name in o.parts]


def run_folder(name: str, o: CheckOptions) -> Path | None:
    """The run folder a runner part (`runner`, `torchrun`) trained in this check's work folder; None before it did."""
    budget, row = runner_budget(o) if name == "runner" else RUNNER[name]
    found = sorted((o.work / "runs" / budget).glob(f"{row}-s1-*"))
    return found[-1] if found else None


def measured(part: Part, o: CheckOptions, outcome: Outcome) -> list[str]:
    """The part's figures, read from what it wrote in this run; a part that wrote nothing readable says so."""
    log = o.out / "logs" / f"{part.name}.log"
    if part.name == "bench":
        return bench_lines(o.out / f"{BENCH}.json", epoch(outcome.started))
    if part.name == "runner":
        return [*runner_lines(run_folder(part.name, o)), *recompile_lines(log)]
    if part.name in RUNNER:
        return runner_lines(run_folder(part.name, o))
    return tests_lines(log)


def judged(outcome: Outcome, lines: list[str]) -> Outcome:
    """A part that passed with a best-effort stage cut at its limit fails after all if that stage had a test fail
    before the cut: named in the summary pytest prints when stopped, or marked F or E in its progress."""
    broken = [line for line in lines if line.startswith(("FAILED ", "ERROR ")) or BROKEN_SO_FAR in line]
    if "best effort" not in outcome.result or not broken:
        return outcome
    return dataclasses.replace(outcome, result="failed (a test failed before the limit cut a best-effort stage)")


def carried(part: Part, o: CheckOptions) -> dict:
    """The run records of a runner part (not its checkpoints), which gpu-check.json carries back; {} for the others."""
    folder = run_folder(part.name, o) if part.name in RUNNER else None
    return records(folder) if folder else {}


def check(o: CheckOptions, parts: list[Part], meta: dict) -> list[Outcome]:
    """Every part in turn, the report rewritten after each; a part's failure, time-out or broken output stops no other."""
    outcomes: list[Outcome] = []
    body: dict[str, list[str]] = {"targets": []}
    kept: dict[str, dict] = {}  # part -> its run's records
    (o.out / "logs").mkdir(parents=True, exist_ok=True)
    prepare.seed_runs(o.data, o.work / "runs")
    with tqdm(parts, desc="gpu check", unit="part", dynamic_ncols=True) as bar:
        for part in bar:
            bar.set_postfix(part=part.name, limit=f"{part.limit_s} s")
            log = o.out / "logs" / f"{part.name}.log"
            if part.skip:
                outcome = Outcome(part.skip, 0.0, utc_now(), ())
            else:
                outcome = run_part(part, log, REPO)
            try:
                body[part.name], kept[part.name] = measured(part, o, outcome), carried(part, o)
            except Exception as exc:  # noqa: BLE001 - a part's output unreadable: said, and the next part runs
                body[part.name] = [f"its output could not be read: {type(exc).__name__}: {exc}"]
            outcome = judged(outcome, body[part.name])
            if not outcome.result.startswith(("passed", "skipped")):
                outcome = Outcome(outcome.result, outcome.seconds, outcome.started, outcome.stages, tail=tail(log))
            outcomes.append(outcome)
            tqdm.write(f"{part.name}: {outcome.result} ({outcome.seconds:.0f} s)", file=sys.stderr)
            done = {p.name: x for p, x in zip(parts, outcomes)}
            runner = run_folder("runner", o) if "runner" in done else None
            body["targets"] = targets(o.out, done, runner, o.quick)
            write_report(meta, parts, outcomes, body, o.work, kept)
    return outcomes


def set_earlier_aside(out: Path) -> None:
    """An earlier check's files in the out folder go into earlier-<its start>/: never read as this run's, never lost."""
    try:
        started = json.loads((out / "gpu-check.json").read_text()).get("date", "unknown")
    except (OSError, ValueError):
        started = "unknown"
    earlier = [p for p in out.iterdir() if not p.name.startswith("earlier-")] if out.is_dir() else []
    if not earlier:
        return
    aside = out / f"earlier-{started.replace(':', '')[:17]}"
    n = 1
    while aside.exists():
        aside, n = aside.with_name(f"{aside.name.split('~')[0]}~{n}"), n + 1
    aside.mkdir()
    for path in earlier:
        path.rename(aside / path.name)
    print(f"the files of an earlier check in {out} are now in {aside.name}/", file=sys.stderr)


def parse(argv: list[str]) -> CheckOptions:
    p = OneLineParser(prog="python -m ablations.bench.check", description=__doc__.split("\n")[0])
    p.add_argument(
        "--data", help="a prepared folder (gpu-data) or a data folder (default: $AIAYN_DATA, ../shared/data)"
    )
    p.add_argument("--device", default="cuda", help="cuda or cuda:N, or cpu (default cuda)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, the smoke budget, few steps: about a minute")
    p.add_argument("--pytest-args", help="the tests part as one pytest command (default: its three stages)")
    p.add_argument(
        "--parts", default=",".join(LIMITS), help=f"comma list of the parts to run (default: all, {','.join(LIMITS)})"
    )
    p.add_argument("--work", help="keep the parts' runs in this folder (default: a temporary one)")
    p.add_argument(
        "--out", default=str(Path("reports") / "gpu"), help="the folder of the reports (default reports/gpu)"
    )
    a = p.parse_args(argv)
    resolve_device(a.device)  # a bad name, or cuda where there is none: one line
    parts = tuple(name.strip() for name in a.parts.split(",") if name.strip())
    if not parts or set(parts) - set(LIMITS):
        raise ValueError(f"--parts {a.parts!r}: give a comma list of {', '.join(LIMITS)}")
    out = Path(a.out)
    if out.suffix == ".md" or out.is_file():
        raise ValueError(f"--out {a.out}: give a folder (the check writes several files into it), e.g. reports/gpu")
    writable_folder(out)
    data = prepare.check_data(data_dir(a.data).resolve())
    try:
        work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"--work {a.work}: cannot make the folder ({exc.strerror or exc}); give a writable one"
        ) from None
    pytest_args = tuple(shlex.split(a.pytest_args)) if a.pytest_args else ()
    shown = shown_args(argv, {a.out: OUT} if os.path.isabs(a.out) else {})  # $OUT on a GPU machine
    return CheckOptions(
        a.device, a.quick, data, work.resolve(), a.work is not None, out.resolve(), pytest_args, shown, parts
    )


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def stamp(o: CheckOptions) -> dict:
    """What every report of this run carries: the card and its peak, the software, the commit and the start."""
    device = resolve_device(o.device)
    commit = machine()["commit"]
    if commit == "unknown" and o.data.manifest.get("commit"):  # a copy of the repository without git
        commit = f"{o.data.manifest['commit']} (the prepared folder's)"
    found = peak(device)
    return {
        **machine(),
        "commit": commit,
        "device": describe_device(device),
        "peak": "no bf16 peak on a CPU"
        if device.type == "cpu"
        else f"bf16 dense {found}"
        if found
        else "an unknown card: no peak, no MFU",
        "python": sys.version.split()[0],
        "transformers": version("transformers"),
        "data": o.data.about,
        "args": o.args,
        "out": str(o.out),
    }


def prepare_main(argv: list[str]) -> int:
    p = OneLineParser(prog="python -m ablations.bench.check --prepare", description=prepare.__doc__.split("\n")[0])
    p.add_argument("--prepare", required=True, help="the folder to make, e.g. gpu-data (git-ignored)")
    p.add_argument("--data", help="the data folder to copy (default: $AIAYN_DATA, ../shared/data)")
    a = p.parse_args(argv)
    prepare.prepare(data_dir(a.data), Path(a.prepare))
    return 0


@stops_cleanly("the parts run so far are in the report; --parts NAMES runs the others")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if any(arg == "--prepare" or arg.startswith("--prepare=") for arg in argv):
            return prepare_main(argv)
        o = parse(argv)
    except FORESEEN as exc:  # a bad flag value, no GPU, no data folder: one line
        return failed(exc)
    become_subreaper()  # what a part leaves running, even orphaned, is found and stopped
    set_earlier_aside(o.out)
    meta = stamp(o)
    try:
        outcomes = check(o, plan(o), meta)
    finally:
        if not o.keep:
            shutil.rmtree(o.work, ignore_errors=True)
    print((o.out / "gpu-check.md").read_text())
    return 0 if all(x.result.startswith(("passed", "skipped")) for x in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
