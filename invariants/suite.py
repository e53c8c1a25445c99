"""The suite: every property (invariants/properties/, in the paper's order) run against one model with a progress bar,
selected by name, and failures that follow from another failure named as such."""

from __future__ import annotations

import sys
import time

import hypothesis
from tqdm import tqdm

from invariants.engine import FAIL, Property, Result
from invariants.guard import DEFAULT_TIMEOUT_S
from invariants.properties import PROPERTIES
from invariants.lm.subject import LMSubject
from invariants.subject import Factory, Subject

BY_NAME = {p.name: p for p in PROPERTIES}
LINE_EVERY_S = 5.0  # off a terminal, a progress line at most this often instead of a bar
# Names that older reports and replay lines give, and what became of them.
RETIRED = {
    "dropout_every_sublayer": "renamed dropout_sites (dropout at the sites of section 5.4, and none elsewhere)",
    "lr_schedule": "not a property of the model: eq. (3) is the trainer's, checked by the harness's own tests",
}


def select(names: list[str] | None, pool: list[Property] = PROPERTIES) -> list[Property]:
    """The named properties of `pool` (all when names is empty; the encoder-decoders' by default); an unknown name is
    a ValueError listing the valid ones."""
    if not names:
        return pool
    by_name = {p.name: p for p in pool}
    retired = [f"{n}: {RETIRED[n]}" for n in names if n in RETIRED]
    if retired:
        raise ValueError("; ".join(retired))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(
            f"unknown propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; valid: {', '.join(by_name)}"
        )
    return [by_name[n] for n in names]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, carrying the verdicts reached before it (so that they can be saved)."""

    def __init__(self, results: list[Result]) -> None:
        super().__init__(f"stopped after {len(results)} properties")
        self.results = results


def run_suite(
    model: str | Factory | Subject | LMSubject,
    properties: list[Property] | None = None,
    settings: hypothesis.settings | None = None,
    seed: int | None = None,
    replay: tuple[str, bytes] | None = None,
    progress: bool = False,
    profile: str = "",
    device: str = "cpu",
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> list[Result]:
    """Run properties (default: all) against one model, on `device` unless it is a Subject (which has its own); a bad
    spec raises model.SpecError before any runs, Ctrl-C raises Interrupted with the verdicts reached so far, and each
    property gets `timeout` seconds (None: no limit)."""
    subject = model if isinstance(model, (Subject, LMSubject)) else Subject(model, device)
    results: list[Result] = []
    chosen = properties or PROPERTIES
    on_terminal = progress and sys.stderr.isatty()
    bar = tqdm(chosen, desc=subject.name, unit="property", disable=not on_terminal, leave=False)
    start = last = time.monotonic()
    try:
        for i, prop in enumerate(bar):
            bar.set_postfix_str(prop.name)
            if progress and not on_terminal and time.monotonic() - last >= LINE_EVERY_S:  # a log: a line, not a bar
                last = time.monotonic()
                print(
                    f"{subject.name}: {i} of {len(chosen)} properties in {last - start:.0f} s; now {prop.name}",
                    file=sys.stderr,
                    flush=True,
                )
            results.append(prop(subject, settings=settings, seed=seed, replay=replay, profile=profile, timeout=timeout))
    except KeyboardInterrupt:
        raise Interrupted(results) from None
    return consequences(results)


# Checks that build on what another checks: the dropout counts assume section 3.1's post-LN blocks, with normalisations
# that keep their gains and biases; where those fail, a failure here is likely theirs, not dropout's.
BUILDS_ON = {
    name: ("post_ln_order", "layer_norm_outputs", "gradients_reach_all", "residual_paths")
    for name in ("residual_dropout", "dropout_sites", "dropout_with_positions")
}


def consequences(results: list[Result]) -> list[Result]:
    """The results, each failure of a check that builds on another failing one noted as likely its consequence."""
    failed = {r.name for r in results if r.verdict == FAIL}
    for r in results:
        causes = [c for c in BUILDS_ON.get(r.name, ()) if c in failed]
        if r.verdict == FAIL and causes:
            r.reason += (
                f"; likely a consequence of {', '.join(causes)} failing (this check assumes what they check): "
                "fix that first"
            )
    return results
