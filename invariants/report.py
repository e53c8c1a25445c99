"""The suite's outputs: a terminal table, reports/invariants/<model>.md and .json, and the kill matrix."""

from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path
from typing import Any

import hypothesis
import torch
from tabulate import tabulate

from invariants.engine import ERROR, FAIL, NOT_APPLICABLE, PASS, VERDICTS, Result
from plumbing.files import write_atomic
from plumbing.provenance import git_commit

MARK = {PASS: "pass", FAIL: "FAIL", NOT_APPLICABLE: "n/a", ERROR: "ERROR"}
PARTIAL = ".partial"  # <slug>.partial.json and .md: a run of some properties only, beside the full report


def slug(spec: str) -> str:
    """A file name for a model spec: 'mutant:no_causal_mask' -> 'mutant-no_causal_mask'."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", spec).strip("-.") or "model"


def number(x: float | str | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, str) or not math.isfinite(x):
        return str(x)
    return "0" if x == 0 else f"{x:.3g}"


def bound(r: Result | dict) -> str:
    r = r if isinstance(r, dict) else r.to_dict()
    return f"{'>=' if r['bound'] == 'at_least' else '<='} {number(r['tolerance'])}"


def summary_table(results: list[Result], fmt: str = "simple") -> str:
    rows = [
        [r.group.split()[0], r.name, MARK[r.verdict], number(r.worst_error), bound(r), r.examples, f"{r.seconds:.1f}"]
        for r in results
    ]
    return tabulate(
        rows,
        ["#", "property", "verdict", "worst error", "tolerance", "examples", "s"],
        tablefmt=fmt,
        disable_numparse=True,
    )


def counts_text(counts: dict[str, int]) -> str:
    """'24 pass, 1 fail, 2 not applicable' (errors only when there are some)."""
    text = f"{counts[PASS]} pass, {counts[FAIL]} fail, {counts[NOT_APPLICABLE]} not applicable"
    return text + (f", {counts[ERROR]} error" if counts.get(ERROR) else "")


def summary_line(spec: str, results: list[Result], seconds: float, profile: str) -> str:
    """The run in one line: the counts, then what was not applicable and why (so a skip is never silent)."""
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    skipped = "; ".join(f"{r.name} ({r.reason})" for r in results if r.verdict == NOT_APPLICABLE)
    return f"{spec}: {counts_text(counts)} in {seconds:.0f} s (profile {profile})" + (
        f"; not applicable: {skipped}" if skipped else ""
    )


def document(
    spec: str,
    results: list[Result],
    profile: str,
    command: str,
    seconds: float,
    device: str = "cpu",
    partial: str = "",
    contract: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The report as JSON. `partial` says why it holds fewer properties than the suite (--only, a replay, Ctrl-C): such a
    report is written beside the full one, never over it; `contract` holds the protocol's breaches, member -> what."""
    return {
        "model": spec,
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "hypothesis": hypothesis.__version__,
        "profile": profile,
        "command": command,
        "seconds": round(seconds, 1),
        "verdicts": {v: sum(r.verdict == v for r in results) for v in VERDICTS},
        **({"partial": partial} if partial else {}),
        **({"contract": dict(contract)} if contract else {}),
        "properties": [r.to_dict() for r in results],
    }


def markdown(doc: dict[str, Any]) -> str:
    props = doc["properties"]
    rows = [
        [
            p["group"].split()[0],
            f"`{p['name']}`",
            MARK[p["verdict"]],
            number(p["worst_error"]),
            bound(p),
            p["examples"],
            p["description"],
        ]
        for p in props
    ]
    lines = [
        f"# Invariants: `{doc['model']}`",
        "",
        f"{counts_text(doc['verdicts'])} "
        f"({doc['seconds']} s; hypothesis profile `{doc['profile']}`; torch {doc['torch']}; commit {doc['commit']}; {doc['date']}"
        + (f"; on {doc['device']}" if doc.get("device", "cpu") != "cpu" else "")
        + ").",
        "",
        f"Regenerate: `{doc['command']}`",
        "",
        *(
            [f"Partial report: {doc['partial']}. The full report, `{slug(doc['model'])}.md`, is left as it was.", ""]
            if doc.get("partial")
            else []
        ),
        *(
            [
                "## Breaches of the protocol's contract",
                "",
                *(f"- `{m}`: {why}" for m, why in doc["contract"].items()),
                "",
            ]
            if doc.get("contract")
            else []
        ),
        tabulate(
            rows,
            ["#", "property", "verdict", "worst error", "tolerance", "examples", "what it checks"],
            tablefmt="github",
            disable_numparse=True,
        ),
        "",
    ]
    notes = [p for p in props if p["reason"] or p["reproduce"]]
    if notes:
        lines += ["## Failures, notes and reasons", ""]
        for p in notes:
            lines.append(f"- `{p['name']}` ({MARK[p['verdict']]}): {p['reason']}")
            if p["reproduce"]:
                lines.append(f"  replay: `{p['reproduce']}`")
        lines.append("")
    lines += ["## Tolerances", ""]
    lines += [f"- `{p['name']}` {bound(p)}: {p['tolerance_reason']}" for p in props]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write <out>/<slug>.json and .md (<slug>.partial.* for a partial report, which so never replaces a full one),
    each whole or not at all (a resumed kill matrix reads them); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    stem = slug(doc["model"]) + (PARTIAL if doc.get("partial") else "")
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    write_atomic(json_path, json.dumps(doc, indent=1) + "\n")
    write_atomic(md_path, markdown(doc))
    return json_path, md_path
