"""The kill matrix: every mutant through every property. A mutant no property fails is a hole in the suite.

Each mutant's report is written to <out>/mutants/ as it finishes, so an interrupted run resumes where it
stopped (pass fresh=True to recompute); the matrix is assembled from those reports.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import hypothesis
from tabulate import tabulate
from tqdm import tqdm

from invariants import report
from invariants.engine import ERROR, FAIL, NOT_APPLICABLE, Property
from invariants.lm.mutants import LM_MUTANTS
from invariants.lm.properties import LM_PROPERTIES
from invariants.lm.subject import LMSubject
from invariants.mutants import MUTANTS
from invariants.subject import OWN_CONFIG, Overrides, Subject
from invariants.suite import PROPERTIES, run_suite
from model.registry import ModelSpec, format_config_overrides
from plumbing.files import write_atomic
from plumbing.provenance import git_commit

CELL = {FAIL: "x", NOT_APPLICABLE: "-", "pass": ".", ERROR: "E"}


@dataclass(frozen=True)
class Family:
    """What a kill matrix runs: the mutants (each with a `bug`), the properties, the spec name mutants go by, and the
    subject that builds them."""

    mutants: Mapping[str, Any]
    properties: list[Property]
    target: str
    subject: Callable[[ModelSpec, str], Subject | LMSubject]
    where: str = ""  # the configs, in words, where the overrides do not say it


ENCODER_DECODER = Family(MUTANTS, PROPERTIES, "mutant", Subject)
DECODER_ONLY = Family(
    LM_MUTANTS,
    LM_PROPERTIES,
    "lm-mutant",
    LMSubject,
    "each mutant's own config (invariants/lm/mutants.py: the paper's decoder small, or modern with GQA and a window)",
)


def mutant_spec(name: str, overrides: Overrides, family: Family = ENCODER_DECODER) -> ModelSpec:
    return ModelSpec(family.target, name, overrides)


def run_mutants(
    out: Path,
    settings: hypothesis.settings,
    profile: str,
    overrides: Overrides = OWN_CONFIG,
    fresh: bool = False,
    command: str = "",
    device: str = "cpu",
    family: Family = ENCODER_DECODER,
) -> list[dict[str, Any]]:
    """Run (or reuse) the report of every mutant of `family`, on `device`; returns their report documents."""
    docs = []
    for name in tqdm(family.mutants, desc="mutants", unit="mutant"):
        spec = mutant_spec(name, overrides, family)
        path = out / "mutants" / f"{report.slug(str(spec))}.json"
        if path.exists() and not fresh:
            try:
                doc = json.loads(path.read_text())
            except ValueError:  # damaged: computed again
                doc = None
            if (
                isinstance(doc, dict)
                and doc.get("profile") == profile
                and doc.get("device", "cpu") == device
                and [p["name"] for p in doc.get("properties", [])] == [p.name for p in family.properties]
            ):
                docs.append(doc)
                continue
        start = time.perf_counter()
        subject = family.subject(spec, device)
        results = run_suite(subject, family.properties, settings=settings, profile=profile)
        doc = report.document(str(spec), results, profile, command, time.perf_counter() - start, device)
        report.write(doc, out / "mutants")
        docs.append(doc)
    return docs


ORACLE = "oracle_"  # the properties that run the paper's equations on the model's own weights (invariants/properties/oracle.py)


def localised(doc: dict[str, Any]) -> str | None:
    """Where the paper-as-oracle properties say a mutant first departs from the paper's equations ('' where they
    fail without naming a sub-layer); None where they all pass: the mutant leaves the eval-mode function as it is."""
    failed = [p for p in doc["properties"] if p["name"].startswith(ORACLE) and p["verdict"] == FAIL]
    found = (re.search(r"first departs at ([\w.]+)", p.get("reason") or "") for p in failed)
    sites = [m.group(1) for m in found if m]
    return sites[0] if sites else ("" if failed else None)


def matrix(
    docs: list[dict[str, Any]], command: str, overrides: Overrides = OWN_CONFIG, family: Family = ENCODER_DECODER
) -> dict[str, Any]:
    names = [doc["model"].split(":", 1)[1].split(",")[0] for doc in docs]
    verdicts = {name: {p["name"]: p["verdict"] for p in doc["properties"]} for name, doc in zip(names, docs)}
    mutants = family.mutants
    return {
        "mutants": names,
        "properties": [p.name for p in family.properties],
        "verdicts": verdicts,
        "caught": {name: any(v == FAIL for v in verdicts[name].values()) for name in names},
        # correct variants (a float32 softmax and loss): "caught" there is a false failure, so they must pass
        "controls": [name for name in names if getattr(mutants[name], "control", False)],
        "known_bug": {name: getattr(mutants[name], "known_bug", True) for name in names},
        "bugs": {name: mutants[name].bug for name in names},
        "localised": {name: localised(doc) for name, doc in zip(names, docs)},
        "specs": {name: doc["model"] for name, doc in zip(names, docs)},
        "config": format_config_overrides(overrides),
        "where": family.where,
        "command": command,
        "commit": git_commit(),
    }


def markdown(kill: dict[str, Any]) -> str:
    props = kill["properties"]
    controls = kill.get("controls", [])
    oracle = any(p.startswith(ORACLE) for p in props)  # the encoder-decoders' matrix has the paper-as-oracle column
    rows = [
        [
            f"`{m}`" + (" (control)" if m in controls else "" if kill["known_bug"][m] else " *"),
            *(CELL[kill["verdicts"][m][p]] for p in props),
            caught_cell(kill["caught"][m], m in controls),
            *([oracle_cell(kill.get("localised", {}).get(m, "-"))] if oracle else []),
        ]
        for m in kill["mutants"]
    ]
    bugs = [m for m in kill["mutants"] if m not in controls]
    sites = kill.get("localised", {})
    changed = [m for m in kill["mutants"] if sites.get(m) is not None]
    where = kill.get("where") or (
        f"config {kill['config']}" if kill.get("config") else "the base config (the paper's 65M model)"
    )
    killed_by = {p: sum(kill["verdicts"][m][p] == FAIL for m in kill["mutants"]) for p in props}
    lines = [
        "# Kill matrix: mutants x invariants",
        "",
        f"{sum(kill['caught'][m] for m in bugs)} of {len(bugs)} mutants caught, at {where}; "
        f"{sum(not kill['caught'][m] for m in controls)} of {len(controls)} controls (correct variants, which must "
        "fail nothing) pass. "
        "x = the property fails on the mutant (kills it); . = passes; - = not applicable; E = the check raised "
        f"(an error, which catches nothing). * = beyond the {sum(kill['known_bug'].values())} bugs known from real code: near misses of each "
        "property, so that every property is seen to fail on a plausible bug.",
        "",
        *(
            [
                f"The paper as an oracle (the `{ORACLE}*` properties: the paper's equations on the mutant's own weights, "
                f"eval mode) fail on {len(changed)} mutants and name the first sub-layer that departs for "
                f"{sum(bool(sites[m]) for m in changed)} of them (last column); on the other "
                f"{len(kill['mutants']) - len(changed)} they pass (.): their eval-mode function is the paper's, and "
                "they change training, dropout, the loss or how weights are shared, which the other properties judge.",
                "",
            ]
            if oracle
            else []
        ),
        f"Regenerate: `{kill['command']}` (commit {kill['commit']}).",
        "",
        tabulate(
            rows,
            ["mutant", *range(1, len(props) + 1), "caught", *(["oracle: first departs at"] if oracle else [])],
            tablefmt="github",
            disable_numparse=True,
        ),
        "",
        "Columns:",
        "",
        *[f"{i}. `{p}` (kills {killed_by[p]})" for i, p in enumerate(props, 1)],
        "",
        "Mutants:",
        "",
        *[f"- `{m}`: {kill.get('bugs', {}).get(m) or MUTANTS[m].bug}" for m in kill["mutants"]],
        "",
    ]
    return "\n".join(lines)


def caught_cell(caught: bool, control: bool) -> str:
    """The 'caught' column: a bug must be caught; a control (a correct variant) must not be."""
    if control:
        return "**FALSE FAILURE**" if caught else "no (correct)"
    return "yes" if caught else "**NO**"


def missed(kill: dict[str, Any]) -> list[str]:
    """Mutants no property fails, and controls some property fails: each a hole or a false verdict."""
    controls = kill.get("controls", [])
    return [m for m, caught in kill["caught"].items() if caught == (m in controls)]


def oracle_cell(site: str | None) -> str:
    return "." if site is None else f"`{site}`" if site else "caught, not localised"


def write(kill: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "kill_matrix.json", out / "kill_matrix.md"
    write_atomic(json_path, json.dumps(kill, indent=1) + "\n")
    write_atomic(md_path, markdown(kill))
    return json_path, md_path
