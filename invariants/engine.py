"""How an invariant runs: hypothesis draws the cases, the check measures an error, the tolerance gives the verdict.

An invariant is a plain function check(subject, case) -> measured error, wrapped by `@invariant` into
a `Property` that you call with a model spec: `causal_future_tokens("reference")` returns a `Result`.
Pinned cases (the spec's own config, e.g. the 65M base model, on small shapes) run first as
hypothesis @example's; then hypothesis draws cases (random small configs, shapes, padding, seeds).
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Union

import hypothesis
import torch
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from hypothesis.errors import DidNotReproduce, Unsatisfiable, UnsatisfiedAssumption

from invariants import precision, profiles
from invariants.device import checking
from invariants.groups import Group
from invariants.guard import (
    DEFAULT_TIMEOUT_S,
    NotApplicable,
    Skipped,
    TimedOut,
    harness_limit,
    harness_stop,
    member_at_fault,
    time_limit,
)
from invariants.lm.subject import LMSubject
from invariants.subject import Factory, Subject
from invariants.tolerances import Tolerance
from model import kernels

PASS, FAIL, NOT_APPLICABLE, ERROR = "pass", "fail", "not_applicable", "error"
VERDICTS = (PASS, FAIL, NOT_APPLICABLE, ERROR)
FIXED = "fixed: the case that failed now passes"  # a replayed failure that no longer fails
NOT_RUN = "not run: contract breach"  # a property that calls a member which breaks the protocol's contract
# The seed of the derandomized profile (ci): hypothesis would derive it from the source of the function it
# drives, so that any edit to this module drew other cases for every property; pinned to what it derived until now.
DERANDOMIZED_SEED = 0x68179C81C3C21C82C1FCB526F6F9954DA002A7FB3E86964C83DC34C955F8C953C0A26C1569615C06CF643F43688EF191


def invocation() -> str:
    """The command that runs the suite where the user ran it: `nox -s invariants --` inside that nox session (nox sets
    NOX_CURRENT_SESSION, and the plain module would fail from the user's shell, which lacks torch), else the module."""
    return "nox -s invariants --" if os.environ.get("NOX_CURRENT_SESSION") == "invariants" else "python -m invariants"


class Violation(AssertionError):
    """A case whose measured error breaks the tolerance."""


@dataclass
class Result:
    """One property's verdict on one model, as written to the report."""

    name: str
    group: str
    description: str
    verdict: str  # pass | fail | not_applicable | error (the check raised: neither a pass nor a finding)
    worst_error: float | None  # the largest error measured (the smallest, for an at_least bound)
    tolerance: float
    bound: str  # at_most | at_least
    tolerance_reason: str
    examples: int  # cases evaluated, pinned and drawn (and shrinking steps after a failure)
    reason: str = ""  # why it failed or is not applicable
    reproduce: str = ""  # the command (and @reproduce_failure line) that replays a failure
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["worst_error"] is not None and d["worst_error"] in (float("inf"), float("-inf")):
            d["worst_error"] = str(d["worst_error"])  # JSON has no Infinity
        return d


@dataclass(frozen=True)
class Property:
    """A named invariant: its check, its tolerance, the cases it runs on, and the capabilities it needs."""

    name: str
    group: str  # the part of the paper's design it checks, a Group's label: "1 causal mask (section 3.2.3)"
    description: str
    check: Callable[[Subject, Any], float | tuple[float, str]]  # the error, or (error, a note for the report)
    tolerance: Tolerance
    pinned: Callable[[Subject], list] = lambda subject: []
    cases: Callable[[Subject], st.SearchStrategy] | None = None
    needs: tuple[str, ...] = ()
    applicable: Callable[[Subject], str | None] = field(default=lambda subject: None)
    describe: Callable[[Any], str] = repr  # a case in words, for the failure message
    precision: str = "forward"  # the part whose precision the tolerance depends on (invariants/precision.py)

    def __call__(
        self,
        model: Union[str, Factory, Subject],
        settings: hypothesis.settings | None = None,
        seed: int | None = None,
        replay: tuple[str, bytes] | None = None,
        profile: str = "",
        device: str = "cpu",
        timeout: float | None = DEFAULT_TIMEOUT_S,
    ) -> Result:
        """The property's verdict on a model spec, factory or subject (a subject runs on its own device)."""
        subject = model if isinstance(model, (Subject, LMSubject)) else Subject(model, device)
        return run(self, subject, settings, seed, replay, profile, timeout)


REGISTRY: dict[str, Property] = {}  # every property by name, in the order of definition


def invariant(
    group: Group,
    tolerance: Tolerance,
    pinned: Callable[[Subject], list] = lambda s: [],
    cases: Callable[[Subject], st.SearchStrategy] | None = None,
    needs: tuple[str, ...] = (),
    applicable: Callable[[Subject], str | None] = lambda s: None,
    describe: Callable[[Any], str] = repr,
    precision: str = "forward",
    registry: dict[str, Property] = REGISTRY,
) -> Callable[[Callable], Property]:
    """Turn check(subject, case) -> error into a Property named after the function, its docstring's first line its
    description, and register it in `registry` (the encoder-decoders' by default; invariants/lm/ keeps the decoder-only
    models' apart): a suite runs the registered properties in the order they are defined."""

    def wrap(check: Callable[[Subject, Any], float]) -> Property:
        description = (check.__doc__ or "").strip().splitlines()[0]
        prop = Property(
            check.__name__,
            group.label,
            description,
            check,
            tolerance,
            pinned,
            cases,
            needs,
            applicable,
            describe,
            precision,
        )
        known = registry.get(prop.name)
        if known is not None and known.check.__module__ != check.__module__:
            raise ValueError(f"two properties named {prop.name}: in {known.check.__module__} and {check.__module__}")
        registry[prop.name] = prop
        return prop

    return wrap


def suite_settings(parent: hypothesis.settings | None = None) -> hypothesis.settings:
    """The profile's settings with what torch checks need: no deadline, no shared database, blobs printed."""
    return hypothesis.settings(
        parent or hypothesis.settings(),
        deadline=None,
        database=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def run(
    prop: Property,
    subject: Subject,
    settings: hypothesis.settings | None = None,
    seed: int | None = None,
    replay: tuple[str, bytes] | None = None,
    profile: str = "",
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> Result:
    """Run one property against one subject and return its Result (never raises for a model's failure).

    Whatever the model raises or returns, in any phase (the contract, the capability probes, applicability, the cases,
    the measurement), the outcome is this property's verdict: a breach of the protocol's contract is `error` naming
    the member, a non-finite measurement a `fail`, anything raised an `error` naming where, and a property still
    running after `timeout` seconds (None: no limit) an `error` "timed out after N s" (invariants/guard.py).

    settings default to the suite's profile ($HYPOTHESIS_PROFILE, else ci); profile names it in the replay command.
    The reference's CPU kernels are used if built but never built here: a build takes longer than every check
    together, and the checks run mostly in float64 on small batches, where the kernels save little. On CUDA the
    property runs without TF32 and with deterministic algorithms (invariants/device.py).
    """
    with kernels.without_building(), checking(subject.device):
        return _run(prop, subject, settings, seed, replay, profile, timeout)


def _run(
    prop: Property,
    subject: Subject,
    settings: hypothesis.settings | None,
    seed: int | None,
    replay: tuple[str, bytes] | None,
    profile: str,
    timeout: float | None,
) -> Result:
    start = time.perf_counter()
    tol = prop.tolerance
    result = Result(prop.name, prop.group, prop.description, PASS, None, tol.value, tol.bound, tol.reason, 0)
    breach = subject.breach(prop.name, timeout)
    if breach:
        result.verdict, result.reason = ERROR, f"{NOT_RUN} in {breach}: {subject.breaches[breach]}"
        return result
    judged_at = ""
    if tol.below_float64 is not None:
        downcast = subject.downcast(prop.precision)
        tol = tol.at(downcast is not None)
        judged_at = precision.judged_at(downcast, prop.precision)
        result.tolerance, result.tolerance_reason = tol.value, tol.reason
    limit = harness_limit(prop.name, subject.config.vocab_size, subject.config.max_len)
    if limit:
        result.verdict, result.reason = NOT_APPLICABLE, limit
        return result

    judge = Judge(prop, subject, tol, result)
    settings = suite_settings(settings or profiles.profile(profiles.default_name()))
    if seed is None and not settings.derandomize:
        seed = random.getrandbits(32)
    command = _replay_command(prop, subject, settings, seed, profile)
    try:
        with time_limit(timeout):
            _drive(prop, subject, judge, settings, seed, replay)
    except NotApplicable as exc:
        result.verdict, result.reason = NOT_APPLICABLE, str(exc)
        result.seconds = time.perf_counter() - start
        return result
    except Unsatisfiable:  # every case was skipped
        result.verdict = NOT_APPLICABLE
        result.reason = f"every case was skipped: {_skips(judge.skipped)}"
        result.seconds = time.perf_counter() - start
        return result
    except DidNotReproduce:  # raised only under --replay: the replayed case ran and met the tolerance
        result.reason = f"{FIXED} (replayed: {replay[1].decode()!r}; without --replay the property runs its cases)"
    except TimedOut:
        result.verdict, result.reproduce = ERROR, command
        result.reason = (
            f"timed out after {timeout:g} s (a member that never returns? the limit is --timeout); "
            f"{result.examples} cases measured by then"
        )
    except BaseException as exc:  # a violation fails; anything else raised is an error, never counted as a finding
        if harness_stop(exc):  # Ctrl-C or SIGTERM: the suite stops (an adapter's own SystemExit does not)
            raise
        _raised(result, exc, command)
    result.reason = "; ".join([result.reason, *judge.notes(judged_at)]).strip("; ")
    result.seconds = time.perf_counter() - start
    return result


class Judge:
    """Measures one case at a time into `result` (examples, worst error), keeping the note of the worst case, the
    failing case and the skipped cases for the reason; a case that breaks the tolerance raises Violation."""

    def __init__(self, prop: Property, subject: Subject, tol: Tolerance, result: Result) -> None:
        self.prop, self.subject, self.tol, self.result = prop, subject, tol, result
        self.worst_note = ""  # the note of the worst case, for the report
        self.failing: tuple[float, str] | None = None  # (error, note) of the last case that broke the tolerance
        self.skipped: dict[str, str] = {}  # cases left out (a config the adapter refuses, ...) -> why

    def __call__(self, case: Any) -> None:
        result, tol = self.result, self.tol
        try:
            with torch.no_grad():  # checks that need gradients ask for them with torch.enable_grad()
                measured = self.prop.check(self.subject, case)
        except Skipped as exc:
            self.skipped[exc.what] = exc.why
            hypothesis.reject()
        error, note = measured if isinstance(measured, tuple) else (measured, "")
        error = float(error)
        result.examples += 1
        if not math.isfinite(error):  # NaN or Inf meets no bound, whichever its direction
            result.worst_error, self.worst_note = error, note
            self.failing = (error, note)
            raise Violation(f"measured {error}{_on(self.prop, case)}: not a finite number, which never passes")
        if result.worst_error is None or _worse(error, result.worst_error, tol):
            result.worst_error, self.worst_note = error, note
        elif note and not self.worst_note and error == result.worst_error:
            self.worst_note = note  # an equally bad case that has something to say
        if tol.violated(error):
            self.failing = (error, note)
            raise Violation(f"error {error:.3g} breaks the tolerance ({tol.bound} {tol.value:g}){_on(self.prop, case)}")

    def notes(self, judged_at: str) -> list[str]:
        """What the reason adds to the verdict: the failing case's note, then the worst case's where it differs (or the
        worst case's note on a pass), the cases skipped, and the precision the model was judged at."""
        verdict, notes = self.result.verdict, []
        if self.failing and verdict == FAIL:
            note = self.failing[1]
            notes += [f"on that case: {note}"] if note else []
            if self.worst_note and self.worst_note != note:
                worst = self.worst_note.split("; ")[0]  # its first clause: the rest repeats the failing case's
                notes.append(f"at the worst error measured ({self.result.worst_error:.3g}), on another case: {worst}")
        elif self.worst_note:
            notes.append(self.worst_note)
        if self.skipped and verdict in (PASS, FAIL):
            notes.append(f"cases skipped: {_skips(self.skipped)}")
        if judged_at and verdict in (PASS, FAIL):
            notes.append(judged_at)
        return notes


def _drive(
    prop: Property,
    subject: Subject,
    judge: Judge,
    settings: hypothesis.settings,
    seed: int | None,
    replay: tuple[str, bytes] | None,
) -> None:
    """Feed the judge the pinned cases, then hypothesis's draws (or, for a property with fixed cases, those alone)."""
    why_not = subject.lacks(*prop.needs) or prop.applicable(subject)
    if why_not:
        raise NotApplicable(why_not)
    if prop.cases is None:  # a fixed set of cases: nothing for hypothesis to draw
        for case in prop.pinned(subject):
            try:
                judge(case)
            except UnsatisfiedAssumption:  # a skipped case
                pass
        if judge.skipped and not judge.result.examples:
            raise NotApplicable(f"every case was skipped: {_skips(judge.skipped)}")
        return

    def body(case: Any) -> None:
        judge(case)

    test = given(case=prop.cases(subject))(body)
    for case in reversed(prop.pinned(subject)):
        test = example(case=case)(test)
    test = settings(test)
    test = hypothesis.seed(DERANDOMIZED_SEED if settings.derandomize else seed)(test)
    if replay is not None:
        test = hypothesis.reproduce_failure(*replay)(test)
    test()


def _replay_command(
    prop: Property, subject: Subject, settings: hypothesis.settings, seed: int | None, profile: str
) -> str:
    """The command that runs this property alone on this model again, with the profile or seed that drew its cases."""
    command = f"{invocation()} --model '{subject.name}' --only {prop.name}"
    command += f" --device {subject.device}" if subject.device.type != "cpu" else ""
    return command + (
        f" --profile {profile or 'ci'}"
        if settings.derandomize
        else f"{' --profile ' + profile if profile else ''} --seed {seed}"
    )


def _raised(result: Result, exc: BaseException, command: str) -> None:
    """A case that broke the tolerance fails; anything else raised is an error naming where; both get the command that
    replays them (with hypothesis's @reproduce_failure blob where it printed one)."""
    result.verdict = FAIL if isinstance(exc, Violation) else ERROR
    hypothesis_notes = [n.strip() for n in getattr(exc, "__notes__", [])]
    blob = next(
        (n.split("adding ", 1)[1].split(" as a decorator")[0] for n in hypothesis_notes if "@reproduce_failure" in n),
        "",
    )
    where = "" if isinstance(exc, Violation) else member_at_fault(exc)
    what = str(exc) if isinstance(exc, Violation) else f"raised {type(exc).__name__}: {exc}"
    what += f" (in {where})" if where else ""
    result.reason = " ".join(what.split())[:500]
    result.reproduce = command + (f' --replay "{blob}"' if blob else "")


def _on(prop: Property, case: Any) -> str:
    """' on the failing case ...' in words, or '' for a property with one fixed case (a parameter count)."""
    described = prop.describe(case)
    return f" on the failing case {described}" if described else ""


def _skips(skipped: dict[str, str]) -> str:
    """The skipped cases in words: the first three with why, and how many more."""
    shown = [f"{what} ({why})" for what, why in list(skipped.items())[:3]]
    more = len(skipped) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def _worse(error: float, worst: float, tol: Tolerance) -> bool:
    if error != error:  # NaN is the worst
        return True
    return error < worst if tol.at_least else error > worst
