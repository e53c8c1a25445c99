"""`python -m invariants --model SPEC`: check the paper's invariants on a model and write its report.

Exit status: 0 when no property fails or errs, 1 when one does (with --strict also when one is not applicable),
2 for a bad spec or option (one line on stderr). `--kill-matrix` runs every mutant instead and writes
<out>/kill_matrix.{json,md}; a mutant counts as caught only when a property fails on it (an error is no catch).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import hypothesis

from invariants import device, killmatrix, profiles, report
from invariants.engine import ERROR, FAIL, FIXED, NOT_APPLICABLE, NOT_RUN, Property, invocation
from invariants.guard import DEFAULT_TIMEOUT_S, STOP, stop_on
from invariants.mutants import MUTANTS
from invariants.lm.properties import LM_PROPERTIES
from invariants.lm.subject import LMSubject
from invariants.subject import Subject
from invariants.suite import PROPERTIES, Interrupted, run_suite, select
from model.lm.registry import annotation_hint, is_decoder_only, parse_lm_spec
from model.registry import ModelSpec, SpecError, default_spec, parse_config_overrides, parse_spec
from plumbing.files import StorageError, writable_folder

DEFAULT_OUT = Path("reports/invariants")  # the published reports: the kill matrix's default, others' by --out
USER_OUT = Path("runs/invariants")  # every model's report without --out: beside the user's runs, out of git
# Mutants run at a small config: the matrix takes minutes instead of an hour; --mutant-overrides "" for base.
MUTANT_OVERRIDES = "N=2,d_model=64,h=4,d_k=16,d_v=16,d_ff=128,vocab_size=1000"


def parse_replay(text: str) -> tuple[str, bytes]:
    """ "@reproduce_failure('6.170.15', b'AXic...')" -> ('6.170.15', b'AXic...')."""
    match = re.fullmatch(r"\s*@?reproduce_failure\((.*)\)\s*", text)
    try:
        version, blob = ast.literal_eval(f"({match.group(1)})")
        assert isinstance(version, str) and isinstance(blob, bytes)
    except Exception:
        raise ValueError(
            f"--replay {text!r} is not a line @reproduce_failure('VERSION', b'BLOB') from a report"
        ) from None
    return version, blob


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m invariants", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="model spec (default: $AIAYN_MODEL or reference); see README")
    p.add_argument(
        "--profile",
        default=None,
        choices=list(profiles.EXAMPLES),
        help="hypothesis profile (default: $HYPOTHESIS_PROFILE if one of these, else ci: derandomized)",
    )
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed for the random profiles (dev, thorough)")
    p.add_argument(
        "--device",
        default="cpu",
        help="torch device the model runs on, e.g. cuda or cuda:1 (default: cpu); the checks stay on the CPU",
    )
    p.add_argument("--only", default="", help="comma-separated property names (default: all; --list shows them)")
    p.add_argument("--replay", default=None, help="a @reproduce_failure(...) line from a report, with --only NAME")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"report folder (default: {USER_OUT}; the published reports: --out {DEFAULT_OUT})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds each property may take before it is recorded as an error (default: {DEFAULT_TIMEOUT_S:g}; 0: none)",
    )
    p.add_argument("--kill-matrix", action="store_true", help="run every mutant and write the kill matrix")
    p.add_argument(
        "--mutant-overrides",
        default=MUTANT_OVERRIDES,
        help=f"config overrides for the mutants in --kill-matrix (default: {MUTANT_OVERRIDES}; '' for base)",
    )
    p.add_argument("--fresh", action="store_true", help="with --kill-matrix: recompute mutant reports already on disk")
    p.add_argument(
        "--decoder-only",
        action="store_true",
        help=f"with --kill-matrix: the decoder-only mutants, each at its own config (default out: {DEFAULT_OUT / 'lm'})",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 also when a property is not applicable (a missing capability hides what it would check)",
    )
    p.add_argument("--list", action="store_true", help="list the properties and mutants, then exit")
    return p


def list_all() -> None:
    for prop in PROPERTIES:
        print(f"{prop.group.split()[0]:>2}  {prop.name:<30} {prop.description}")
    print()
    for name, mutant in MUTANTS.items():
        print(f"mutant:{name:<26} {mutant.bug}")
    print("\ndecoder-only models (--model lm-reference, hf-gpt2, hf-llama, hf-mistral, hf-qwen2, ...):")
    for prop in LM_PROPERTIES:
        print(f"{prop.group.split()[0]:>2}  {prop.name:<30} {prop.description}")
    print()
    for name, mutant in killmatrix.DECODER_ONLY.mutants.items():
        print(f"lm-mutant:{name:<23} {mutant.bug}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    STOP.clear()
    # Ctrl-C and SIGTERM alike: the verdicts reached are written (the handlers are put back on the way out)
    previous = {stop: signal.signal(stop, stop_on) for stop in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run(args, argv)
    except KeyboardInterrupt:
        saved = (
            (
                f"the mutants' reports finished so far are in {args.out / 'mutants'}; the same command without "
                "--fresh goes on from there"
            )
            if args.kill_matrix
            else "no report written; run the same command again"
        )
        print(f"stopped by {STOP.get('signal', 'SIGINT')}: {saved}", file=sys.stderr)
        return 130
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Check one model (or every mutant, with --kill-matrix) and write the report; the exit status."""
    if args.list:
        list_all()
        return 0
    warnings.filterwarnings("ignore", message="enable_nested_tensor is True")  # torch.nn's note on odd head counts
    here = Path.cwd()  # where the command ran: printed paths are relative to it, whatever an adapter does
    profile_name = args.profile or profiles.default_name()
    command = (invocation() + " " + shlex.join(argv if argv is not None else sys.argv[1:])).strip()
    try:
        text = args.model if args.model is not None else default_spec()
        decoder_only = not args.kill_matrix and is_decoder_only(text)
        pool = LM_PROPERTIES if decoder_only else PROPERTIES
        settings, properties, replay = selection(args, profile_name, pool)
        if args.kill_matrix:
            args.out = (args.out or (DEFAULT_OUT / "lm" if args.decoder_only else DEFAULT_OUT)).resolve()
            writable_folder(args.out)
            return kill_matrix(args, settings, profile_name, command, str(device.resolve(args.device)))
        if args.timeout < 0:
            raise ValueError(f"--timeout {args.timeout:g}: give seconds, or 0 for no limit")
        spec = parse_lm_spec(text) if decoder_only else parse_spec(text)
        args.out = (args.out or default_out(spec)).resolve()  # before the adapter is imported (it may chdir)
        writable_folder(args.out)
        target = str(device.resolve(args.device))
        start = time.perf_counter()
        subject = LMSubject(spec, target) if decoder_only else Subject(spec, target)
    except (SpecError, ValueError) as exc:
        hint = annotation_hint(args.model or "") if not args.kill_matrix else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    partial = "" if len(properties) == len(pool) else f"{len(properties)} of {len(pool)} properties (--only)"
    try:
        results = run_suite(
            subject, properties, settings, args.seed, replay, True, profile_name, timeout=args.timeout or None
        )
    except Interrupted as stop:
        partial = f"stopped by {STOP.get('signal', 'SIGINT')} after {len(stop.results)} of {len(properties)} properties"
        elapsed = time.perf_counter() - start
        doc = report.document(
            str(spec), stop.results, profile_name, command, elapsed, target, partial, subject.breaches
        )
        return stopped(doc, args.out, len(stop.results))
    seconds = time.perf_counter() - start
    doc = report.document(str(spec), results, profile_name, command, seconds, target, partial, subject.breaches)
    # the report first: whatever happens to the printing (a closed pipe), the verdicts are kept
    written = write_report(doc, args.out, here)
    failed = [r for r in results if r.verdict in (FAIL, ERROR)]
    printed(lambda: show(results, subject.breaches, spec, seconds, profile_name, written))
    if written.startswith("the report could not"):
        print(f"error: {written}", file=sys.stderr)
        return 1
    skipped = [r for r in results if r.verdict == NOT_APPLICABLE]
    return 1 if failed or (args.strict and skipped) else 0


def selection(
    args: argparse.Namespace, profile_name: str, pool: list[Property] = PROPERTIES
) -> tuple[hypothesis.settings, list[Property], tuple[str, bytes] | None]:
    """The hypothesis settings, the properties of `pool` that --only names and the --replay line, or a ValueError that
    says which combination of flags cannot run."""
    settings = profiles.profile(profile_name)
    if args.seed is not None and settings.derandomize:
        raise ValueError(
            f"--seed has no effect under the derandomized profile {profile_name}; add --profile dev or thorough"
        )
    properties = select([n.strip() for n in args.only.split(",") if n.strip()], pool)
    replay = parse_replay(args.replay) if args.replay else None
    if replay and len(properties) != 1:
        raise ValueError("--replay needs --only with exactly one property (the one the line came from)")
    return settings, properties, replay


def stopped(doc: dict, out: Path, reached: int) -> int:
    """Save the verdicts reached before a stop as a partial report beside the full one, say where; exit status 130."""
    saved = save(doc, out)
    printed(
        lambda: print(
            f"stopped by {STOP.get('signal', 'SIGINT')}: the {reached} verdicts reached are in {saved}; "
            "the full report is untouched",
            file=sys.stderr,
        )
    )
    return 130


def write_report(doc: dict, out: Path, here: Path) -> str:
    """Write the report to `out`; what was written, in words: where, or why not and where the verdicts went instead."""
    try:
        json_path, md_path = report.write(doc, out)
        return f"report {shown(md_path, here)} and {shown(json_path, here)}"
    except (StorageError, OSError) as exc:
        return f"the report could not be written to {shown(out, here)} ({exc}); the verdicts are in {save(doc, None)}"


def show(results: list, breaches: dict[str, str], spec: ModelSpec, seconds: float, profile: str, written: str) -> None:
    """The table, each contract breach once, each failure with its replay line, and the summary."""
    print(report.summary_table(results))
    for member, why in breaches.items():
        not_run = [r.name for r in results if r.reason.startswith(f"{NOT_RUN} in {member}:")]
        print(f"\ncontract breach in {member}: {why}\n  not run: {len(not_run)} properties ({', '.join(not_run)})")
    for r in results:
        if r.verdict in (FAIL, ERROR) and not r.reason.startswith(NOT_RUN):
            print(f"\n{report.MARK[r.verdict]} {r.name}: {r.reason}\n  replay: {r.reproduce}")
        elif r.reason.startswith(FIXED):
            print(f"\npass {r.name}: {r.reason}")
    print("\n" + report.summary_line(str(spec), results, seconds, profile) + f"; {written}")


def printed(write: Callable[[], None]) -> None:
    """Run `write` (which prints); a reader that has gone (`| head`, `| grep -q`) ends the printing, not the run."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit


def shown(path: Path, here: Path) -> str:
    """A path as the user can type it from where they ran the command (`here`): relative to it when inside it."""
    try:
        return str(path.relative_to(here))
    except ValueError:
        return str(path)


def default_out(spec: ModelSpec) -> Path:
    """Where a report goes without --out: USER_OUT, out of git, for every model, so that a run never changes the
    published reports; they are regenerated only by naming their folder (--out reports/invariants)."""
    return USER_OUT


def save(doc: dict, out: Path | None) -> str:
    """Write a report where it can go: `out`, else a folder under the system's temporary one; where it went, in words."""
    for folder in (out, Path(tempfile.gettempdir()) / "aiayn-invariants"):
        try:
            if folder is not None:
                return str(report.write(doc, folder)[1])
        except (StorageError, OSError):
            continue
    return "no file: no folder could be written (the table above has them)"


def kill_matrix(args: argparse.Namespace, settings, profile_name: str, command: str, target: str) -> int:
    family = killmatrix.DECODER_ONLY if args.decoder_only else killmatrix.ENCODER_DECODER
    if args.decoder_only:  # each decoder-only mutant has its own config; overrides only where given
        given = args.mutant_overrides if args.mutant_overrides != MUTANT_OVERRIDES else ""
        overrides = parse_lm_spec(f"lm-mutant,{given}").overrides
    else:
        overrides = parse_config_overrides(args.mutant_overrides, "--mutant-overrides")
    docs = killmatrix.run_mutants(args.out, settings, profile_name, overrides, args.fresh, command, target, family)
    kill = killmatrix.matrix(docs, command, overrides, family)
    json_path, md_path = killmatrix.write(kill, args.out)
    wrong = killmatrix.missed(kill)
    print(f"{len(kill['mutants']) - len(wrong)} of {len(kill['mutants'])} as they must be; {md_path} and {json_path}")
    if wrong:
        print(f"not caught (or a control failed): {', '.join(wrong)}")
    return 1 if wrong else 0


def exit_now(status: int) -> None:
    """Exit with `status` once the report is written, even where an adapter left a non-daemon thread running (which
    would keep the process alive after the verdicts are out)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        os._exit(status)
    sys.exit(status)


CHILD = "AIAYN_INVARIANTS_STATUS"  # set in the supervised run: the file it writes its exit status to when it ends
PATH = "AIAYN_INVARIANTS_PATH"  # the supervisor's sys.path, which the child takes: it imports the same harness
CHILD_CODE = (
    "import json, os, sys; sys.path[:] = json.loads(os.environ['AIAYN_INVARIANTS_PATH']); "
    "from invariants.__main__ import cli; cli()"
)


def cli() -> None:
    """The command line's entry point (python -m invariants, aiayn-invariants): the checks run in a child process that
    this one supervises, so that a model which ends the process itself (os._exit) cannot end the run with a status
    that reads as a verdict; in the child, main() runs and its status is written down before it exits."""
    status_file = os.environ.get(CHILD)
    if status_file is None and os.name == "posix" and "--list" not in sys.argv[1:]:
        exit_now(supervise(sys.argv[1:]))
    status = main()
    if status_file:
        Path(status_file).write_text(str(status))
    exit_now(status)


def supervise(argv: list[str]) -> int:
    """Run `python -m invariants argv` as a child and return its status; a child that ends without writing its status
    (the model called os._exit, or a signal killed it) is an error said in one line, never a silent 0. Ctrl-C reaches
    the child from the terminal (this process waits for its partial report); a SIGTERM sent here is passed on."""
    with tempfile.TemporaryDirectory(prefix="aiayn-") as folder:
        status_file = Path(folder) / "status"
        # python -c with the supervisor's sys.path, not -m: a user's own folder may hold a package named invariants
        env = {**os.environ, CHILD: str(status_file), PATH: json.dumps(sys.path)}
        child = subprocess.Popen([sys.executable, "-c", CHILD_CODE, *argv], env=env)
        previous = {
            signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
            signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum)),
        }
        try:
            code = child.wait()
        finally:
            for stop, handler in previous.items():
                signal.signal(stop, handler)
        if status_file.exists():
            return code
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    print(
        f"error: the run ended before its verdicts were written ({how}): the model ended the process itself "
        "(os._exit?), or it was killed; no report was written",
        file=sys.stderr,
    )
    return 128 - code if code < 0 else code or 1


if __name__ == "__main__":
    cli()
