"""The generated blocks of the front page and the docs: results at a glance (README.md) and the property table.

Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` in a Markdown file and is rewritten by
`python -m reports` from the reports on disk (and, for the property table, from `invariants.suite.PROPERTIES`,
the source of `python -m invariants --list`), so that neither can go stale. Same inputs, same text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from invariants.engine import VERDICTS
from invariants.lm.properties import LM_PROPERTIES
from invariants.suite import PROPERTIES
from ablations.runs.folder import warn
from plumbing.files import shown_path, write_atomic
from reports import table3, table3_text
from reports.inputs import (
    BENCH_COMMAND,
    INVARIANTS_COMMAND,
    KILL_MATRIX,
    KILL_MATRIX_COMMAND,
    PARTIAL_JSON,
    MissingInput,
    budget_folders,
    load_budget,
    read_json,
)


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the block NAME's contents replaced by `body`; a file without the markers is a ValueError."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {start} ... {end} markers")
    return pattern.sub(lambda _: f"{start}\n{body.rstrip()}\n{end}", text, count=1)


def _link(path: Path, root: Path) -> str:
    """`path` as a link from a page in `root` (the README's folder)."""
    return Path(os.path.relpath(path.resolve(), root.resolve())).as_posix()


def _short(commit: str) -> str:
    return commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")


def _day(date: str) -> str:
    return date[:10] if date else "undated"


def invariants_rows(folder: Path, root: Path) -> list[str]:
    """One row per model's invariants report: its verdict counts, date and commit."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(PARTIAL_JSON):
            continue  # a run of some properties only, beside the full report
        report = read_json(
            path, KILL_MATRIX_COMMAND if path.name == KILL_MATRIX else INVARIANTS_COMMAND.format(model="SPEC")
        )
        if report is None or not isinstance(report.get("verdicts"), dict) or "model" not in report:
            continue  # the kill matrix, or a damaged report (named once, by read_json)
        counts = ", ".join(
            f"{report['verdicts'][v]} {v.replace('_', ' ')}" for v in VERDICTS if report["verdicts"].get(v)
        )
        rows.append(
            _row(
                f"[invariants]({_link(path.with_suffix('.md'), root)}), `{report['model']}`",
                counts,
                report.get("date", ""),
                report.get("commit", "?"),
            )
        )
    return rows


def decoder_only_row(folder: Path, root: Path) -> list[str]:
    """One row for every decoder-only model's report: each model's verdict counts, the latest date and commit."""
    rows = [row.split(" | ") for row in invariants_rows(folder, root)]
    if not rows:
        return []
    latest = max(rows, key=lambda row: row[-1])
    models = "; ".join(f"{row[0].split('), ', 1)[1]} {row[1]}" for row in rows)
    return [f"| [invariants, decoder-only]({_link(folder, root)}) | {models} | {latest[-1]}"]


def kill_matrix_row(folder: Path, root: Path) -> str | None:
    """How many mutants the matrix in `folder` catches and how many properties each fails, with date and commit."""
    path = folder / KILL_MATRIX
    matrix = read_json(path, KILL_MATRIX_COMMAND) if path.is_file() else None
    try:
        counted = {m: sum(v == "fail" for v in matrix["verdicts"].get(m, {}).values()) for m in matrix["mutants"]}
        controls = set(matrix.get("controls", []))  # correct variants, which must fail nothing
        len(matrix["properties"])
    except (AttributeError, KeyError, TypeError):
        return None  # absent, or damaged (named once, by read_json or reports.inputs)
    fails = {m: n for m, n in counted.items() if m not in controls}
    if not fails:
        return None
    caught = sum(n > 0 for n in fails.values())
    passing = sum(counted.get(c, 1) == 0 for c in controls)
    checked = f"; {passing} of {len(controls)} correct controls fail nothing" if controls else ""
    mutants = [read_json(p, KILL_MATRIX_COMMAND) for p in sorted((folder / "mutants").glob("*.json"))]
    dates = [str(doc.get("date", "")) for doc in mutants if doc is not None]
    where = "decoder-only" if matrix.get("where") else "small config" if matrix.get("config") else "base config"
    return _row(
        f"[kill matrix]({_link(path.with_suffix('.md'), root)}), {where}",
        f"{caught} of {len(fails)} mutants caught (a property fails on them), each failing "
        f"{min(fails.values())} to {max(fails.values())} of {len(matrix['properties'])} properties{checked}",
        max(dates, default=""),
        matrix.get("commit", "?"),
    )


def table3_rows(results_dir: Path, out_dir: Path, root: Path) -> list[str]:
    """The headline of every budget's Table 3, newest first, with its date and commit."""
    try:
        folders = budget_folders(results_dir)
    except MissingInput:
        return []
    found = []
    for folder in folders:
        results = load_budget(folder)
        table = table3.compare(results.runs)
        headline = table3_text.headline(results, table, table3.summarize(table))
        date = str(results.runs["date"].dropna().max()) if "date" in results.runs else ""
        commits = sorted(results.runs["commit"].dropna().astype(str)) if "commit" in results.runs else []
        link = _link(out_dir / "table3" / f"{results.budget}.md", root)
        found.append(
            (date, _row(f"[Table 3]({link}), budget {results.budget}", headline, date, commits[-1] if commits else "?"))
        )
    return [row for _, row in sorted(found, reverse=True)]


def bench_rows(path: Path, root: Path) -> list[str]:
    """The benchmark's tokens/s ratios against the reference, per size: training step and beam search."""
    bench = read_json(path, BENCH_COMMAND) if path.is_file() else None
    try:
        return _bench_rows(bench, path, root) if bench is not None else []
    except (AttributeError, KeyError, TypeError, ZeroDivisionError) as exc:
        warn(
            f"skipping {shown_path(path)}: not a benchmark report ({type(exc).__name__}: {exc}); regenerate it with `{BENCH_COMMAND}`"
        )
        return []


def _bench_rows(bench: dict, path: Path, root: Path) -> list[str]:
    rows = []
    for size in ("base", "scaled"):
        for what, key, name_key, rate_key in (
            ("training step", "training", "variant", "tgt_tokens_per_s"),
            ("beam search", "decoding", "system", "output_tokens_per_s"),
        ):
            rates = {r[name_key]: r[rate_key] for r in bench.get(key, []) if r["size"] == size}
            if "reference" in rates and len(rates) > 1:
                ratios = "; ".join(
                    f"{name} {rate / rates['reference']:.2f}x" for name, rate in rates.items() if name != "reference"
                )
                clock = "CPU time" if bench.get("clock") == "cpu" else "wall-clock"
                rows.append(
                    _row(
                        f"[benchmark]({_link(path.with_suffix('.md'), root)}), {what}, {size} size",
                        f"tokens/s ({clock}) against the reference's: {ratios}",
                        bench.get("date", ""),
                        bench.get("commit", "?"),
                    )
                )
    return rows


def _row(what: str, result: str, date: str, commit: str) -> str:
    return f"| {what} | {_cell(result)} | {_day(date)}, {_short(commit)} |"


def glance(results_dir: Path, invariants_dir: Path, out_dir: Path, root: Path) -> str:
    """The results-at-a-glance table: invariants, kill matrices, Table 3 headlines and benchmark ratios."""
    rows = invariants_rows(invariants_dir, root)
    rows += [
        row for row in (kill_matrix_row(invariants_dir, root), kill_matrix_row(invariants_dir / "base", root)) if row
    ]
    rows += decoder_only_row(invariants_dir / "lm", root)  # docs/decoder-only.md
    rows += [row for row in (kill_matrix_row(invariants_dir / "lm", root),) if row]
    rows += table3_rows(results_dir, out_dir, root) + bench_rows(out_dir / "bench.json", root)
    header = [
        f"Generated by `nox -s report` from the reports under `reports/` ({len(PROPERTIES)} properties, "
        f"{len(LM_PROPERTIES)} for decoder-only models; ratios above 1: faster than ours).",
        "",
        "| what | result | date, commit |",
        "|---|---|---|",
    ]
    return "\n".join(header + rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def property_table() -> str:
    """Every property of the suite, in its order: group, name, what it checks (and where from), its tolerance."""
    lines = ["| group | property | what it checks (source) | tolerance (why) |", "|---|---|---|---|"]
    for prop in PROPERTIES:
        tol = prop.tolerance
        bound = f"at least {tol.value:g}" if tol.at_least else f"{tol.value:g}"
        lines.append(
            f"| {_cell(prop.group)} | `{prop.name}` | {_cell(prop.description)} | {bound} ({_cell(tol.reason)}) |"
        )
    return "\n".join(lines) + "\n"


def update(path: Path, name: str, body: str) -> bool:
    """Rewrite block NAME of `path` when the file has its markers; returns whether the text changed."""
    if not path.is_file():
        return False
    text = path.read_text()
    try:
        new = replace_block(text, name, body)
    except ValueError:
        return False
    if new != text:
        write_atomic(path, new)
    return new != text


def write(results_dir: Path, invariants_dir: Path, out_dir: Path) -> list[Path]:
    """Refresh README.md's glance block and docs/invariants.md's property table beside `out_dir` (the repository)."""
    root = out_dir.resolve().parent
    targets = [
        (root / "README.md", "glance", lambda: glance(results_dir, invariants_dir, out_dir, root)),
        (root / "docs" / "invariants.md", "properties", property_table),
    ]
    return [path for path, name, body in targets if path.is_file() and update(path, name, body())]
