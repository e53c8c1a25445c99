"""The GPU check's data, made beforehand on a CPU: `python -m ablations.bench.check --prepare gpu-data`.

A prepared folder travels with the repository to the GPU machine, so that no GPU minute goes on reading corpora or
training a tokenizer:

    gpu-data/PREPARED.json   what it holds: the commit and date it was made at, the source, each budget's BPE
    gpu-data/data/           the data folder's corpora (the runner reads them; the tests part's data tests too)
    gpu-data/cache/          the runner's cache for the check's budgets: their BPE models
    gpu-data/prepared/       each budget's encoded training and dev sets (ablations/grid/prepared.py), for the bench

On the GPU, `--data gpu-data` finds the corpora in data/, seeds every part's runs folder with cache/ and hands the
bench prepared/.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ablations.grid.prepared import save_prepared
from ablations.grid.runner import prepare_data
from ablations.runs.budgets import budget
from plumbing.files import write_atomic
from plumbing.provenance import git_commit

MANIFEST = "PREPARED.json"
BUDGETS = ("short", "smoke")  # the runner part's and the torchrun part's; the bench's sizes use the same two


@dataclass(frozen=True)
class CheckData:
    """Where the check's parts read corpora from, the cache that seeds their runs folders and the bench's encoded sets
    (None: not prepared)."""

    corpora: Path
    cache: Path | None
    manifest: dict

    @property
    def encoded(self) -> Path | None:
        return None if self.cache is None else self.cache.parent / "prepared"

    @property
    def about(self) -> str:
        if self.cache is None:
            return f"{os.path.relpath(self.corpora)}, not prepared: each part reads its corpus and may train its BPE"
        made = self.manifest
        return (
            f"{os.path.relpath(self.corpora.parent)}, prepared at commit {made.get('commit')} on "
            f"{made.get('date', '?')[:10]} for the budgets {', '.join(made.get('budgets', {}))}"
        )


def check_data(folder: Path) -> CheckData:
    """A prepared folder (with PREPARED.json), or a plain data folder."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return CheckData(folder, None, {})
    try:
        made = json.loads(manifest.read_text())
    except ValueError:
        raise ValueError(
            f"{manifest} is damaged; make the folder again: python -m ablations.bench.check --prepare {folder}"
        ) from None
    return CheckData(folder / "data", folder / "cache", made)


def size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def prepare(source: Path, target: Path) -> dict:
    """Copy the corpora of `source` into `target`/data and build the check's budgets' BPE and encoded sets into
    `target`/cache; a `target` that is not an earlier prepared folder is refused, never overwritten."""
    if target.exists() and any(target.iterdir()) and not (target / MANIFEST).is_file():
        raise ValueError(f"--prepare {target}: the folder exists and is not a prepared folder; name a new one")
    if (target / MANIFEST).is_file():
        shutil.rmtree(target)  # an earlier prepared folder: made again from scratch
    target.mkdir(parents=True)
    shutil.copytree(source, target / "data")
    made = {"commit": git_commit(), "source": source.name, "budgets": {}}
    for name in BUDGETS:
        b = budget(name)
        data = prepare_data(b, b.preset, target / "data", target)  # its BPE into target/cache
        save_prepared(data, target / "prepared", name)
        made["budgets"][name] = {"preset": data.preset, "bpe": data.bpe_key, "summary": data.summary}
    for stray in (target / "cache").glob("*.lock"):
        stray.unlink()
    made["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    made["mib"] = round(size_mib(target), 1)
    write_atomic(target / MANIFEST, json.dumps(made, indent=2) + "\n")
    print(f"prepared {target}: {made['mib']} MiB ({', '.join(made['budgets'])})", file=sys.stderr)
    return made


def seed_runs(data: CheckData, runs: Path) -> None:
    """A part's runs folder with the prepared cache in it (nothing to do for a folder that is not prepared)."""
    runs.mkdir(parents=True, exist_ok=True)
    if data.cache is not None and data.cache.is_dir() and not (runs / "cache").exists():
        shutil.copytree(data.cache, runs / "cache")
