"""`python -m ablations.bench.gpu_check --data DIR` (nox -s gpu_check): what one GPU must show, in at most 8 minutes.

Four parts, each a process of its own under its own time limit, each reported whether or not another failed:

    bench     the GPU benchmark at the base size, a few repetitions (python -m ablations.bench.gpu)     160 s
    runner    300 steps of the short budget's base row through the runner, step times from its logs      180 s
    torchrun  the smoke budget's row D1 data-parallel over one process (torch.distributed.run)           60 s
    tests     the test suite, python -m pytest -q tests: its failures by name, and how far it got        70 s

470 s in all, with the check's own start and report inside the 8 minutes; `--parts runner,tests` runs some of them
(a rerun in what is left of a GPU loan). `--device cpu --quick` runs the same
parts at tiny sizes on the CPU in under a minute (the tests' check of this code). Writes reports/gpu-check.md and
reports/gpu-check.json, after each part, so that a check stopped midway still says what it saw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ablations.bench.gpu_report import decoding_table, training_table
from ablations.bench.gpu_targets import HEADER, bench_targets, row, runner_targets
from ablations.bench.report import machine, output_path, shown_args
from ablations.data.corpora import data_dir
from ablations.grid.runner import describe_device
from ablations.runs import folder as R
from ablations.runs.options import FORESEEN, OneLineParser, failed, resolve_device
from ablations.training.clock import percentiles
from ablations.training.stopping import stops_cleanly
from model.files import write_atomic

REPO = Path(__file__).resolve().parents[2]
LIMITS = {"bench": 160, "runner": 180, "torchrun": 60, "tests": 70}  # seconds; 470 in all
QUICK_LIMIT = 60  # each part of --quick (the whole takes under a minute)
GRACE_S = 5  # a part that runs on is sent SIGTERM this long before its limit, SIGKILL at it
WORK = "WORK"  # how the report names the temporary folder


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    command: tuple[str, ...]
    limit_s: int
    skip: str = ""  # why it does not run ('': it runs)
    stop_with: signal.Signals = signal.SIGTERM  # sent GRACE_S before the limit; SIGKILL follows at it


@dataclass(frozen=True)
class Outcome:
    result: str  # passed, failed (exit N), timed out at its limit of N s, skipped: why
    seconds: float
    lines: tuple[str, ...]  # what it measured
    tail: str  # the end of its output, where it did not pass


@dataclass(frozen=True)
class CheckOptions:
    device: str  # as given: the parts resolve it themselves
    quick: bool
    data: Path
    work: Path
    keep: bool  # the work folder was given: it stays
    out: Path
    pytest_args: tuple[str, ...]
    args: str
    parts: tuple[str, ...] = tuple(LIMITS)  # which of the four run (--parts), in their order


def runner_budget(o: CheckOptions) -> str:
    """The budget whose base row the runner part trains: short on a GPU, smoke with --quick."""
    return "smoke" if o.quick else "short"


def bench_report(o: CheckOptions) -> Path:
    """Where the bench part writes its report: beside the check's on a GPU, in the work folder with --quick."""
    return (o.work if o.quick else o.out.parent) / "bench-gpu.md"


def plan(o: CheckOptions) -> list[Part]:
    """The parts that --parts selects for a GPU (or, --quick, their tiny versions for the CPU)."""
    py = sys.executable
    common = ("--device", o.device, "--data", str(o.data), "--runs", str(o.work / "runs"))
    run = ("-m", "ablations", "run")
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1")
    limits = dict.fromkeys(LIMITS, QUICK_LIMIT) if o.quick else LIMITS
    if o.quick:
        sizes = ("--sizes", "tiny", "--steps", "3", "--warmup", "1", "--decode-reps", "1", "--time-limit", "30")
        sizes += ("--backends", "default,cudnn")  # the CPU has no cuDNN: the unsupported path, reported
        short = ("--budget", runner_budget(o), "--rows", "base", "--steps", "8", "--dev-pairs", "10")
        smoke = ("--budget", "smoke", "--rows", "D1", "--steps", "4", "--dev-pairs", "10")
    else:
        # Two warm-up steps of two shapes: torch.compile's static graph, then its dynamic one.
        sizes = ("--sizes", "base", "--steps", "10", "--warmup", "2", "--decode-sentences", "16", "--decode-reps", "2")
        sizes += ("--batch-tokens", "25000")  # the paper's batch (section 5.1), which the step's targets are set at
        sizes += ("--time-limit", str(LIMITS["bench"] - 30))  # room for its start and its report
        short = ("--budget", runner_budget(o), "--rows", "base", "--steps", "300", "--dev-pairs", "100")
        smoke = ("--budget", "smoke", "--rows", "D1", "--dev-pairs", "20")
    distributed = "" if torch.distributed.is_available() else "skipped: this torch has no torch.distributed"
    out = ("--out", str(bench_report(o)))
    parts = [
        Part("bench", "the GPU benchmark", (py, "-m", "ablations.bench.gpu", *sizes, *common, *out), limits["bench"]),
        Part("runner", "the runner, one row", (py, *run, *short, *common), limits["runner"]),
        Part(
            "torchrun",
            "the runner under torchrun",
            (py, *torchrun, *run, *smoke, *common),
            limits["torchrun"],
            distributed,
        ),
        # SIGINT: pytest stops as on Ctrl-C and still prints its summary, the failures so far by name.
        Part("tests", "the test suite", (py, "-m", "pytest", *o.pytest_args), limits["tests"], "", signal.SIGINT),
    ]
    return [part for part in parts if part.name in o.parts]


def stop(process: subprocess.Popen, first: signal.Signals = signal.SIGTERM) -> None:
    """End the part's process and its children (its own session): `first`, then SIGKILL after GRACE_S."""
    for signum in (first, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
            process.wait(timeout=GRACE_S)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_part(part: Part, log: Path) -> tuple[str, float]:
    """Run the part's command with its output in `log`; returns its result and seconds."""
    started = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            part.command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
        )
        try:  # stopped GRACE_S before its limit, so that its stop too is inside the limit
            code = process.wait(timeout=max(part.limit_s - GRACE_S, 1))
            result = "passed" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            result = f"timed out at its limit of {part.limit_s} s"
        finally:
            if process.poll() is None:  # timed out, or this check was stopped: its parts stop too
                stop(process, part.stop_with)
    return result, time.perf_counter() - started


def run_folder(runs: Path, budget: str, row: str) -> Path | None:
    found = sorted((runs / budget).glob(f"{row}-s1-*"))
    return found[-1] if found else None


def runner_lines(runs: Path, budget: str, row: str) -> list[str]:
    """What a run recorded: final.json's figures and its step times, per logged window and per step where logged."""
    folder = run_folder(runs, budget, row)
    if folder is None:
        return ["no run folder was written"]
    final, metrics = R.read_final(folder) or {}, [m for m in R.read_metrics(folder) if "time_s" in m]

    def recorded(key: str, form: str = "{}") -> str:
        return "not recorded" if final.get(key) is None else form.format(final[key])

    lines = [
        f"{R.FINAL}: status {recorded('status')}, {recorded('steps')} steps, {recorded('tokens_per_s', '{:,.0f}')} "
        f"tokens/s, MFU {recorded('mfu', '{:.1%}')}, dev PPL {recorded('dev_ppl', '{:.1f}')}, BLEU "
        f"{recorded('bleu', '{:.2f}')}; graphs compiled {recorded('compiles')}, compiling {recorded('compile_s', '{:.1f} s')}"
    ]
    if final.get("error"):
        lines.append(f"error: {final['error']}")
    windows, last = [], (0, 0.0)
    for m in metrics:
        windows.append((m["step"], (m["time_s"] - last[1]) / max(m["step"] - last[0], 1)))
        last = (m["step"], m["time_s"])
    if len(windows) > 1:
        p = percentiles([s for _, s in windows[1:]])
        lines.append(
            f"step time per logged window (time_s deltas / steps), windows after the first: p50 {p['p50'] * 1e3:.1f} ms, "
            f"p99 {p['p99'] * 1e3:.1f} ms, max {p['max'] * 1e3:.1f} ms over {len(windows) - 1} windows; the first "
            f"(to step {windows[0][0]}, where compiling falls) {windows[0][1] * 1e3:.1f} ms"
        )
    steps = [m for m in metrics if m.get("step_s_p50") is not None]
    if steps:
        lines.append(
            f"per step (the runner's own step_s_p50 / step_s_max per window): median of the windows' p50 "
            f"{percentiles([m['step_s_p50'] for m in steps])['p50'] * 1e3:.1f} ms, longest step "
            f"{max(m['step_s_max'] for m in steps) * 1e3:.1f} ms, compiling {sum(m.get('compile_s') or 0 for m in steps):.1f} s"
        )
    else:
        lines.append(f"per-step times: not recorded in {R.METRICS}")
    return lines


def bench_lines(report: Path) -> list[str]:
    try:
        bench = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        return [f"no readable report ({type(exc).__name__})"]
    return [
        *training_table(bench["training"], bench["backend"]),
        "",
        *decoding_table(bench["decoding"]),
        *bench["notes"],
    ]


def tests_lines(log: Path, shown: int = 30) -> list[str]:
    """pytest's closing line (or how far its progress got), then each failed or erring test by name."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    closing = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    progress = re.findall(r"\[\s*(\d+)%\]", text)
    lines = (
        [closing[-1].strip("= ")]
        if closing
        else [f"progress {progress[-1]}% of the collected tests" if progress else "no test result"]
    )
    broken = re.findall(r"^((?:FAILED|ERROR) \S+)", text, flags=re.M)
    lines += broken[:shown] + ([f"and {len(broken) - shown} more"] if len(broken) > shown else [])
    return lines


def targets(o: CheckOptions) -> list[str]:
    """The targets of docs/benchmark.md against what the bench and runner parts wrote so far."""
    lines = [
        "## Targets",
        "",
        "Set for one GPU at the base size"
        + (": on a CPU at tiny sizes these rows only exercise the code." if o.quick else "."),
        "",
        *HEADER,
    ]
    try:
        lines += bench_targets(json.loads(bench_report(o).with_suffix(".json").read_text()))
    except (OSError, ValueError, KeyError):
        lines.append(row("the bench's targets", "-", "-", "not measured: no readable bench report"))
    folder = run_folder(o.work / "runs", runner_budget(o), "base")
    if folder is None:
        return [*lines, row("the runner's targets", "-", "-", "not measured: no run folder")]
    return [*lines, *runner_targets(R.read_metrics(folder), R.read_final(folder) or {})]


def measured(part: Part, o: CheckOptions, log: Path) -> list[str]:
    """The part's figures, read from what it wrote; a part that wrote nothing readable says so."""
    runs = o.work / "runs"
    if part.name == "bench":
        return bench_lines(bench_report(o).with_suffix(".json"))
    if part.name == "runner":
        return runner_lines(runs, runner_budget(o), "base")
    if part.name == "torchrun":
        return runner_lines(runs, "smoke", "D1")
    return tests_lines(log)


def tail(log: Path, lines: int = 15) -> str:
    """The last lines of a part's output, progress bars left out."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    kept = [line for line in text.replace("\r", "\n").splitlines() if line.strip() and not re.search(r"\d%\|", line)]
    return "\n".join(kept[-lines:])


def check(o: CheckOptions, parts: list[Part], meta: dict) -> list[Outcome]:
    """Every part in turn, the report rewritten after each; a part's failure, time-out or broken output stops no other."""
    outcomes: list[Outcome] = []
    with tqdm(parts, desc="gpu check", unit="part", dynamic_ncols=True) as bar:
        for part in bar:
            bar.set_postfix(part=part.name, limit=f"{part.limit_s} s")
            log = o.work / f"{part.name}.log"
            if part.skip:
                outcomes.append(Outcome(part.skip, 0.0, (), ""))
            else:
                result, seconds = run_part(part, log)
                try:
                    lines = measured(part, o, log)
                except Exception as exc:  # noqa: BLE001 - a part's output unreadable: said, and the next part runs
                    lines = [f"its output could not be read: {type(exc).__name__}: {exc}"]
                outcomes.append(Outcome(result, seconds, tuple(lines), "" if result == "passed" else tail(log)))
            tqdm.write(f"{part.name}: {outcomes[-1].result} ({outcomes[-1].seconds:.0f} s)", file=sys.stderr)
            write_report(o, parts, outcomes, meta)
    return outcomes


def shown(command: tuple[str, ...], o: CheckOptions) -> str:
    words = ["python" if w == sys.executable else w.replace(str(o.work), WORK) for w in command]
    return shlex.join(os.path.relpath(w) if os.path.isabs(w) else w for w in words)


def markdown(o: CheckOptions, parts: list[Part], outcomes: list[Outcome], meta: dict) -> str:
    total = sum(x.seconds for x in outcomes)
    lines = [
        "# GPU check: the Table 3 runner on one GPU",
        "",
        f"Run by `python -m ablations.bench.gpu_check {meta['args']}`".rstrip() + f" on {meta['device']}, torch "
        f"{meta['torch']}, Python {meta['python']}, transformers {meta['transformers']}, commit {meta['commit']}, "
        f"{meta['date']}. Parts run: {len(outcomes)} of {len(parts)}, {total:.0f} s of at most "
        f"{sum(p.limit_s for p in parts)} s. {WORK} is a temporary folder, removed afterwards.",
        "",
        "| part | what | limit | result | seconds |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {p.name} | {p.what} | {p.limit_s} s | {x.result} | {x.seconds:.0f} |" for p, x in zip(parts, outcomes)
    ]
    lines += [f"| {p.name} | {p.what} | {p.limit_s} s | not run yet | - |" for p in parts[len(outcomes) :]]
    lines += ["", *targets(o)]
    for part, outcome in zip(parts, outcomes):
        lines += ["", f"## {part.name}: {outcome.result}", "", f"`{shown(part.command, o)}`", ""]
        lines += [line if line.startswith("|") or not line else f"- {line}" for line in outcome.lines]
        if outcome.tail:
            lines += ["", "The end of its output:", "", "```", outcome.tail, "```"]
    return "\n".join(lines) + "\n"


def write_report(o: CheckOptions, parts: list[Part], outcomes: list[Outcome], meta: dict) -> None:
    write_atomic(o.out, markdown(o, parts, outcomes, meta))
    entries = [{**asdict(p), "command": shown(p.command, o), **asdict(x)} for p, x in zip(parts, outcomes)]
    write_atomic(o.out.with_suffix(".json"), json.dumps({**meta, "parts": entries}, indent=2) + "\n")


def parse(argv: list[str]) -> CheckOptions:
    p = OneLineParser(prog="python -m ablations.bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--data", help="data folder, e.g. gpu-data (default: $AIAYN_DATA or ../shared/data)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N; cpu with --quick (default cuda)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, the smoke budget, few steps: under a minute")
    p.add_argument(
        "--pytest-args",
        help="the tests part's arguments (default: -q tests, with -n 8 where pytest-xdist is installed; "
        "--quick: one small file)",
    )
    p.add_argument(
        "--parts", default=",".join(LIMITS), help=f"comma list of the parts to run (default: all, {','.join(LIMITS)})"
    )
    p.add_argument("--work", help="keep the parts' logs and runs in this folder (default: a temporary one)")
    p.add_argument("--out", default=str(Path("reports") / "gpu-check.md"))
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"--device {a.device}: no CUDA device is available here; run it on a GPU, or --device cpu --quick"
        )
    if resolve_device(a.device).type == "cpu" and not a.quick:
        raise ValueError(f"--device {a.device}: the full check needs a GPU; add --quick for its CPU version")
    parts = tuple(name.strip() for name in a.parts.split(",") if name.strip())
    if not parts or set(parts) - set(LIMITS):
        raise ValueError(f"--parts {a.parts!r}: give a comma list of {', '.join(LIMITS)}")
    data, out = data_dir(a.data).resolve(), output_path(a.out).resolve()
    spread = " -n 8" if importlib.util.find_spec("xdist") else ""  # pytest-xdist, where installed: 8 of the cores
    default = "-q tests/ablations/test_gpu_targets.py" if a.quick else f"-q{spread} tests"
    pytest_args = tuple(shlex.split(a.pytest_args or default))
    try:
        work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"--work {a.work}: cannot make the folder ({exc.strerror or exc}); give a writable one"
        ) from None
    return CheckOptions(
        a.device, a.quick, data, work.resolve(), a.work is not None, out, pytest_args, shown_args(argv), parts
    )


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@stops_cleanly("the parts run so far are in the report; --parts NAMES runs the others")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        o = parse(argv)
    except FORESEEN as exc:  # a bad flag value, no GPU, no data folder: one line
        return failed(exc)
    meta = {
        **machine(),
        "device": describe_device(torch.device(o.device)),
        "python": sys.version.split()[0],
        "transformers": version("transformers"),
        "args": o.args,
    }
    try:
        outcomes = check(o, plan(o), meta)
    finally:
        if not o.keep:
            shutil.rmtree(o.work, ignore_errors=True)
    print(o.out.read_text())
    return 0 if all(x.result == "passed" or x.result.startswith("skipped") for x in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
