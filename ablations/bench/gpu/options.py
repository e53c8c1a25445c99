"""The GPU benchmark's options (python -m ablations.bench.gpu --help): what to measure, every value checked before
any work, with defaults that differ by device (a GPU's sizes, modes and bf16; a tiny fp32 run on the CPU)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from ablations.bench.gpu.timing import MODES, SYSTEMS
from ablations.bench.report import output_path, shown_args
from ablations.data.corpora import data_dir
from ablations.training.backends import SDPA_BACKENDS
from plumbing.cli import OneLineParser, check_counts, resolve_device

DESCRIPTION = (
    "the training step of the reference, the torch.nn.Transformer adapter and HF MarianMT on one GPU, and beam search "
    "beside HF generate"
)

# A size: the budget whose data, BPE, batch size and scale it takes, and the Table 3 row it trains.
SIZES = {"base": ("short", "base"), "big": ("short", "big"), "tiny": ("smoke", "base")}


@dataclass(frozen=True)
class BenchOptions:
    """What to measure, every value checked; the defaults differ by device (see `parse`)."""

    device: torch.device
    sizes: tuple[str, ...]
    systems: tuple[str, ...]
    modes: tuple[str, ...]
    backend: str  # attention backend of every mode's entry
    backends: tuple[str, ...]  # compared with it, eager
    precision: str  # bf16 (autocast) or fp32
    steps: int
    warmup: int
    batch_tokens: int | None  # None: the size's budget's
    pad_multiple: int | None  # None: the size's budget's
    compile_backend: str
    decode_sentences: int
    decode_length: int
    extra: int
    decode_reps: int
    time_limit: float | None
    compile_estimate: float  # seconds a compile is taken to need until one is measured
    data: Path
    runs: Path
    prepared: Path | None  # where ablations/grid/prepared.py saved the data (None: read and encode it here)
    out: Path
    args: str

    @property
    def autocast(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None


def choose(flag: str, text: str, allowed: tuple[str, ...], empty: bool = False) -> tuple[str, ...]:
    """A comma list of names from `allowed`, each once; a one-line ValueError naming the flag otherwise."""
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    wrong = [c for c in chosen if c not in allowed]
    if wrong or not (chosen or empty):
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(allowed)}" + (" (or nothing)" if empty else ""))
    return chosen


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations.bench.gpu", description=DESCRIPTION)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)")
    p.add_argument("--runs", default="runs", help="where the BPE cache lives (default runs)")
    p.add_argument("--prepared", help="load the encoded data saved in this folder (else prepare it, and save it there)")
    p.add_argument("--sizes", help=f"{', '.join(SIZES)} (default base,big on a GPU, tiny on the CPU)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"default {','.join(SYSTEMS)}")
    p.add_argument("--modes", help="eager, compiled (default both on a GPU, eager on the CPU)")
    p.add_argument("--backend", help="attention backend of every mode (default efficient on a GPU, as the runner)")
    p.add_argument("--backends", help="backends compared with it, eager: a comma list, or all (default none)")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="default bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--steps", type=int, default=20, help="timed steps per entry (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps per entry (default 3)")
    p.add_argument("--batch-tokens", type=int, help="positions per side per step (default: the size's budget's)")
    p.add_argument("--pad-multiple", type=int, help="pad lengths to a multiple of this (default: the budget's)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (default inductor)")
    p.add_argument("--decode-sentences", type=int, help="sources to beam-search (default 32; 4 on the CPU)")
    p.add_argument("--decode-length", type=int, help="tokens per source (default 20; 8 on the CPU)")
    p.add_argument("--extra", type=int, help="output tokens beyond the source (default 50; 10 on the CPU)")
    p.add_argument("--decode-reps", type=int, default=3, help="timed beam searches per system (default 3)")
    p.add_argument("--time-limit", type=float, help="seconds from when the data is ready: none after it (default none)")
    p.add_argument("--compile-estimate", type=float, default=60.0, help="seconds a compile needs (default 60)")
    p.add_argument("--out", default=str(Path("reports") / "bench-gpu.md"))
    return p


def parse(argv: list[str]) -> BenchOptions:
    """The options, checked before any work: a one-line ValueError (or DataError) naming the flag and the fix."""
    a = parser().parse_args(argv)
    check_counts(
        ("--steps", a.steps),
        ("--warmup", a.warmup),
        ("--batch-tokens", a.batch_tokens),
        ("--pad-multiple", a.pad_multiple),
        ("--decode-sentences", a.decode_sentences),
        ("--decode-length", a.decode_length),
        ("--extra", a.extra),
        ("--decode-reps", a.decode_reps),
    )
    if a.time_limit is not None and not a.time_limit > 0:
        raise ValueError(f"--time-limit {a.time_limit}: give a number of seconds above 0")
    if not a.compile_estimate >= 0:
        raise ValueError(f"--compile-estimate {a.compile_estimate}: give a number of seconds, 0 or more")
    if a.prepared and Path(a.prepared).is_file():
        raise ValueError(f"--prepared {a.prepared} is a file; give the folder the data was prepared in")
    device = resolve_device(a.device)
    gpu = device.type == "cuda"
    backend = choose("--backend", a.backend or ("efficient" if gpu else "default"), SDPA_BACKENDS)
    if len(backend) != 1:
        raise ValueError(f"--backend {a.backend!r}: give one of {', '.join(SDPA_BACKENDS)}")
    backends = ",".join(SDPA_BACKENDS) if a.backends == "all" else a.backends or ""  # others only on request
    return BenchOptions(
        device=device,
        sizes=choose("--sizes", a.sizes or ("base,big" if gpu else "tiny"), tuple(SIZES)),
        systems=choose("--systems", a.systems, tuple(SYSTEMS)),
        modes=choose("--modes", a.modes or ("eager,compiled" if gpu else "eager"), MODES),
        backend=backend[0],
        backends=choose("--backends", backends, SDPA_BACKENDS, empty=True),
        precision=a.precision or ("bf16" if gpu else "fp32"),
        steps=a.steps,
        warmup=a.warmup,
        batch_tokens=a.batch_tokens,
        pad_multiple=a.pad_multiple,
        compile_backend=a.compile_backend,
        decode_sentences=a.decode_sentences or (32 if gpu else 4),
        decode_length=a.decode_length or (20 if gpu else 8),
        extra=a.extra or (50 if gpu else 10),
        decode_reps=a.decode_reps,
        time_limit=a.time_limit,
        compile_estimate=a.compile_estimate,
        data=data_dir(a.data),
        runs=Path(a.runs),
        prepared=Path(a.prepared) if a.prepared else None,
        out=output_path(a.out),
        args=shown_args(argv),
    )
