"""The Table 3 grid: for every selected row and seed, build the model a spec names, train it, score it, record it.

Re-running a grid skips finished (and diverged) runs, resumes unfinished ones from their checkpoint,
retries failed ones up to `max_attempts` times in all, and never overwrites a finished result.
"""
from __future__ import annotations

import datetime
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sentencepiece as spm
import torch
from tqdm.auto import tqdm

from ablations import runs as R
from ablations.batching import BatchStream
from ablations.bpe import bpe_key, encode, shared_bpe
from ablations.budgets import Budget, row_config, row_lr_peak, row_steps
from ablations.data import PRESETS, load_corpus
from ablations.distributed import SINGLE, Ranks, from_main
from ablations.evaluate import dev_bleu, perplexity
from ablations.throughput import gemm_flops, throughput
from ablations.train import Diverged, TrainSettings, train
from model import ModelSpec, count_parameters, load_model
from model.params import training_flops
from model.provenance import git_commit
from model.table3 import Table3Row

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}  # dense, per GPU


@dataclass(frozen=True)
class PreparedData:
    """What every row of a grid shares: the BPE model and the encoded training and dev sets."""

    preset: str
    sp: spm.SentencePieceProcessor
    bpe_key: str
    train_src: list[list[int]]
    train_tgt: list[list[int]]
    dev_src: list[list[int]]
    dev_tgt: list[list[int]]
    dev_refs: list[str]
    summary: str


def prepare_data(b: Budget, preset: str, data: Path, runs: Path) -> PreparedData:
    """Read the preset, train or load the shared BPE, encode; training pairs longer than the budget allows are dropped."""
    print(f"reading the {preset} corpus from {data} ...", file=sys.stderr)
    corpus = load_corpus(preset, data, b.max_train_pairs, b.dev_pairs)
    vocab = b.vocab_size or PRESETS[preset].vocab_size
    sp = shared_bpe(corpus.train, vocab, runs / "cache")
    src, tgt = encode(sp, corpus.train, progress="encoding the training pairs")
    keep = [i for i in range(len(src)) if len(src[i]) <= b.max_sentence_tokens and len(tgt[i]) < b.max_sentence_tokens]
    dev_src, dev_tgt = encode(sp, corpus.dev)
    summary = (f"{preset}: {len(keep)} training pairs ({corpus.removed_overlap} removed for sharing a sentence with dev/test, "
               f"{len(src) - len(keep)} longer than {b.max_sentence_tokens} tokens), {len(dev_src)} dev pairs, BPE {vocab}")
    return PreparedData(preset, sp, bpe_key(corpus.train, vocab), [src[i] for i in keep], [tgt[i] for i in keep],
                        dev_src, dev_tgt, list(corpus.dev.tgt), summary)


def settings_for(row: Table3Row, b: Budget, device: torch.device, accumulation: int | None = None) -> TrainSettings:
    gpu = device.type == "cuda"
    return TrainSettings(
        steps=row_steps(row, b), warmup=b.warmup, lr_peak=row_lr_peak(row, b), batch_tokens=b.batch_tokens, accumulation=accumulation or b.accumulation,
        max_sentence_tokens=b.max_sentence_tokens, log_every=b.log_every, eval_every=b.eval_every,
        checkpoint_every=b.checkpoint_every, precision="bf16" if gpu else "fp32", compile=b.compile and gpu,
    )


@dataclass(frozen=True)
class Grid:
    budget: Budget
    rows: list[Table3Row]
    seeds: list[int]
    model_spec: ModelSpec
    runs: Path
    device: torch.device
    accumulation: int | None = None
    max_attempts: int = 3
    ranks: Ranks = SINGLE  # data-parallel processes of each run (torchrun); rank 0 alone writes


def describe_device(device: torch.device, processes: int = 1) -> str:
    """The device's name; '<n> x <name>' for a data-parallel run over n processes."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return f"{processes} x {name}" if processes > 1 else name


def peak_flops(device: torch.device) -> float | None:
    """bf16 dense peak of a known GPU; None on CPU or an unknown GPU (then MFU is not reported)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def run_identity(grid: Grid, row: Table3Row, seed: int, data: PreparedData) -> dict:
    """Everything that makes a run what it is (its config.json); a hash of it names the run's directory."""
    b = grid.budget
    settings = settings_for(row, b, grid.device, grid.accumulation)
    return {"row": row.name, "group": row.group, "seed": seed, "budget": b.name, "preset": data.preset,
            "scaled": b.scaled, "model_spec": str(grid.model_spec), "config": row_config(row, b, data.sp.get_piece_size()).to_dict(),
            "train": settings.to_dict(), "data": {"bpe": data.bpe_key, "max_train_pairs": b.max_train_pairs, "dev_pairs": b.dev_pairs}}


def run_directory(grid: Grid, row: Table3Row, seed: int, data: PreparedData) -> Path:
    return R.run_dir(grid.runs, grid.budget.name, row.name, seed, run_identity(grid, row, seed, data))


def ended(directory: Path, max_attempts: int) -> str | None:
    """The status of a run that is not to be trained again (finished, diverged, failed max_attempts times), else None."""
    before = R.status(directory)
    if before in ("finished", "diverged") or (before == "failed" and R.failed_attempts(directory) >= max_attempts):
        return before
    return None


def run_one(grid: Grid, row: Table3Row, seed: int, data: PreparedData,
            on_step: Callable[[int], None] | None = None) -> tuple[Path, str]:
    """Train and score one row with one seed unless its result is already final; returns (run dir, status).

    The run's lock makes this process its one writer; a run another process holds is left to it (status
    R.BUSY). Data-parallel, rank 0 alone holds the lock, writes and scores (the other ranks return 'trained').
    """
    directory, status, _ = claim_and_run(grid, row, seed, data, on_step)
    return directory, status


def claim_and_run(grid: Grid, row: Table3Row, seed: int, data: PreparedData,
                  on_step: Callable[[int], None] | None = None) -> tuple[Path, str, bool]:
    """run_one's work; the last value says whether this process trained the run (False: it had ended, or is busy)."""
    directory = run_directory(grid, row, seed, data)
    main = grid.ranks.main
    done = from_main(ended(directory, grid.max_attempts) if main else None, grid.ranks)
    if done:
        return directory, done, False
    if main:
        directory.mkdir(parents=True, exist_ok=True)
    with R.claim(directory) if main else nullcontext(True) as mine:
        if not from_main(mine, grid.ranks):
            return directory, R.BUSY, False
        done = from_main(ended(directory, grid.max_attempts) if main else None, grid.ranks)  # ended while we looked
        if done:
            return directory, done, False
        if main:
            prepare_directory(directory, run_identity(grid, row, seed, data), f"{row.name} s{seed}")
        return directory, train_and_score(grid, row, seed, data, directory, on_step), True


def prepare_directory(directory: Path, identity: dict, label: str) -> None:
    """Under the run's lock: clear what a killed writer left, set a damaged final.json aside, drop a failed one (retried)."""
    R.remove_temporaries(directory)
    problem = R.final_problem(directory / R.FINAL)
    if problem:
        aside = R.set_aside(directory / R.FINAL, "damaged")
        print(f"{label}: {directory / R.FINAL} is {problem}: set aside as {aside.name}; the run is done again", file=sys.stderr)
    (directory / R.FINAL).unlink(missing_ok=True)  # only a failed result reaches here: it is retried
    R.write_json(directory / R.CONFIG, identity)


def train_and_score(grid: Grid, row: Table3Row, seed: int, data: PreparedData, directory: Path,
                    on_step: Callable[[int], None] | None) -> str:
    """Build, train (resuming), score and record one run whose lock this process holds; returns its status."""
    b = grid.budget
    cfg = row_config(row, b, data.sp.get_piece_size())
    settings = settings_for(row, b, grid.device, grid.accumulation)
    identity = run_identity(grid, row, seed, data)
    header = {k: v for k, v in identity.items() if k not in ("config", "train", "data")}
    final = {**header, "status": "finished", "error": None, "dev_ppl": None, "bleu": None, "bleu_tokenized": None,
             "sacrebleu_signature": None, "params": None, "steps": 0, "tokens_seen": 0, "wall_s": None,
             "tokens_per_s": None, "mfu": None, "gemm_fraction": None, "device": describe_device(grid.device, grid.ranks.world), "torch": torch.__version__,
             "commit": git_commit(), "date": None, "config": cfg.to_dict()}
    label = f"{row.name} s{seed}"
    try:
        torch.manual_seed(seed)
        model = load_model(grid.model_spec.with_config(cfg)).to(grid.device)
        counts = count_parameters(model.parameter_groups())
        final["params"] = counts["total"]
        stream = BatchStream(data.train_src, data.train_tgt, settings.micro_tokens, seed)
        state = train(model, settings, stream, (data.dev_src, data.dev_tgt), directory, grid.device, label, on_step,
                      grid.ranks, R.config_hash(identity))
        if not grid.ranks.main:
            return "trained"
        final.update(steps=state.step, tokens_seen=state.tokens_seen, wall_s=state.wall_s,
                     tokens_per_s=state.tokens_seen / state.wall_s if state.wall_s else None)
        peak = peak_flops(grid.device)
        if final["tokens_per_s"]:  # about half the tokens are source, half target; tokens/s of all ranks
            half = final["tokens_per_s"] / 2
            if peak:
                final["mfu"] = training_flops(cfg, counts, half, half) / (peak * grid.ranks.world)
            # What this machine's fp32 GEMMs reach now, on this process's threads: the step's share of it.
            final["gemm_fraction"] = throughput(cfg, counts, half, half, 1.0, gemm_flops(grid.device))["gemm_fraction"]
        started = time.perf_counter()
        final["dev_ppl"] = perplexity(model, data.dev_src, data.dev_tgt, grid.device, settings.micro_tokens, settings.autocast,
                                      progress=label)
        scores = dev_bleu(model, data.sp, data.dev_src, data.dev_refs, grid.device, settings.beam, settings.alpha,
                          settings.extra_len, settings.autocast, max_tokens=settings.micro_tokens, progress=label)
        final.update(bleu=scores.bleu, bleu_tokenized=scores.bleu_tokenized, sacrebleu_signature=scores.signature,
                     eval_s=time.perf_counter() - started)
        R.write_atomic(directory / "dev_hypotheses.txt", "".join(h + "\n" for h in scores.hypotheses))
    except Diverged as exc:  # every rank sees the same (summed) loss, so all ranks stop here together
        final.update(status="diverged", error=str(exc), steps=exc.step)
    except R.StorageError:  # the disk, not the run: nothing to record (it could not be written), the grid stops
        raise
    except Exception as exc:  # noqa: BLE001 - one row's failure (out of memory, ...) must not stop the grid; recorded, retried
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        final.update(status="failed", error=error)
        if grid.ranks.main:
            R.record_failure(directory, error)
        if grid.ranks.parallel:  # ranks out of step cannot go on together: the torchrun job ends, a re-run retries
            write_final(directory, final, grid.ranks)
            raise
    write_final(directory, final, grid.ranks)
    return final["status"]


def write_final(directory: Path, final: dict, ranks: Ranks) -> None:
    """final.json, dated, metrics that are not finite as null; rank 0 alone writes it."""
    if ranks.main:
        final["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        R.write_json(directory / R.FINAL, {k: R.finite_or_none(v) if isinstance(v, float) else v for k, v in final.items()})


def outcome_line(row: str, seed: int, status: str, final: dict, directory: Path) -> str:
    """One run's line under the grid's bar, rounded for people."""
    if status == R.BUSY:
        return f"{row:>4} s{seed}: {status} ({R.holder(directory)})  {directory}"
    metrics = [f"dev PPL {R.rounded(final.get('dev_ppl'), 1) or '-'}", f"BLEU {R.rounded(final.get('bleu'), 2) or '-'}"]
    if isinstance(final.get("params"), int):
        metrics.append(f"{final['params'] / 1e6:.2f}M params")
    if final.get("wall_s") is not None:
        metrics.append(R.duration(final["wall_s"]))
    return f"{row:>4} s{seed}: {status:<8}  {'  '.join(metrics)}  {directory}"


def run_grid(grid: Grid, data: PreparedData) -> list[tuple[Path, str]]:
    """Every (row, seed) in the paper's order under one progress bar; returns each run's directory and status.

    Runs that already ended are skipped (the bar counts them); runs another process holds are left to it.
    """
    jobs = [(row, seed) for row in grid.rows for seed in grid.seeds]
    skipped = sum(ended(run_directory(grid, row, seed, data), grid.max_attempts) is not None for row, seed in jobs)
    if grid.ranks.main and skipped:
        print(f"{skipped} of {len(jobs)} runs already ended (finished, diverged, or failed {grid.max_attempts} times): "
              f"skipped; {len(jobs) - skipped} to run", file=sys.stderr)
    outcomes = []
    with tqdm(jobs, desc=f"grid {grid.budget.name}", unit="run", dynamic_ncols=True, disable=not grid.ranks.main) as bar:
        for row, seed in bar:
            bar.set_postfix(row=row.name, seed=seed, skipped=skipped)
            directory, status, trained = claim_and_run(grid, row, seed, data)
            if grid.device.type == "cuda":
                torch.cuda.empty_cache()  # hand back what a run that ran out of memory held before the next one starts
            if grid.ranks.main and (trained or status == R.BUSY):
                tqdm.write(outcome_line(row.name, seed, status, R.read_final(directory / R.FINAL) or {}, directory), file=sys.stderr)
            outcomes.append((directory, status))
    return outcomes
