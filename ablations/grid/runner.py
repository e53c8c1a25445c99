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
from torch import nn
from tqdm.auto import tqdm

from ablations.data.batching import BatchStream
from ablations.data.bpe import bpe_key, encode, shared_bpe
from ablations.data.corpora import PRESETS, load_corpus
from ablations.runs import folder as R
from ablations.runs.budgets import Budget, row_config, settings_for
from ablations.runs.options import RunOptions
from ablations.runs.outcomes import outcome_line
from ablations.scoring.evaluate import dev_bleu, perplexity
from ablations.training.backends import sdpa_backend
from ablations.training.checkpoints import TrainState
from ablations.training.distributed import SINGLE, Ranks, backend, from_main
from ablations.training.peaks import peak
from ablations.training.throughput import gemm_flops, throughput
from ablations.training.train import Diverged, train
from model import ModelSpec, count_parameters, load_model
from model.params import training_flops
from model.table3 import Table3Row
from plumbing.files import StorageError, write_atomic
from plumbing.provenance import git_commit


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
    summary = (
        f"{preset}: {len(keep)} training pairs ({corpus.removed_overlap} removed for sharing a sentence with dev/test, "
        f"{len(src) - len(keep)} longer than {b.max_sentence_tokens} tokens), {len(dev_src)} dev pairs, BPE {vocab}"
    )
    return PreparedData(
        preset,
        sp,
        bpe_key(corpus.train, vocab),
        [src[i] for i in keep],
        [tgt[i] for i in keep],
        dev_src,
        dev_tgt,
        list(corpus.dev.tgt),
        summary,
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

    @classmethod
    def of(cls, options: RunOptions, device: torch.device | None = None, ranks: Ranks = SINGLE) -> Grid:
        """The grid a `run` request asks for, on `device` (else the request's)."""
        return cls(
            options.budget,
            list(options.rows),
            list(options.seeds),
            options.spec,
            options.runs,
            device or options.device,
            options.accumulation,
            options.max_attempts,
            ranks,
        )


def describe_device(device: torch.device, processes: int = 1) -> str:
    """The device's name; '<n> x <name>' for a data-parallel run over n processes."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return f"{processes} x {name}" if processes > 1 else name


def plan_run(grid: Grid, row: Table3Row, seed: int, data: PreparedData) -> R.Run:
    """One (row, seed) of the grid as a Run: its settings, its model config, and its identity (config.json), whose
    hash names its folder."""
    b = grid.budget
    settings = settings_for(row, b, grid.device, grid.accumulation)
    config = row_config(row, b, data.sp.get_piece_size())
    identity = {
        "row": row.name,
        "group": row.group,
        "seed": seed,
        "budget": b.name,
        "preset": data.preset,
        "scaled": b.scaled,
        "model_spec": str(grid.model_spec),
        "config": config.to_dict(),
        "train": settings.to_dict(),
        "data": {"bpe": data.bpe_key, "max_train_pairs": b.max_train_pairs, "dev_pairs": b.dev_pairs},
    }
    return R.Run.at(grid.runs, identity, settings, config)


def ended(directory: Path, max_attempts: int) -> str | None:
    """The status of a run that is not to be trained again (finished, diverged, failed max_attempts times), else None."""
    before = R.status(directory)
    if before in ("finished", "diverged") or (before == "failed" and R.failed_attempts(directory) >= max_attempts):
        return before
    return None


def run_one(
    grid: Grid, row: Table3Row, seed: int, data: PreparedData, on_step: Callable[[int], None] | None = None
) -> tuple[Path, str]:
    """Train and score one row with one seed unless its result is already final; returns (run dir, status).

    The run's lock makes this process its one writer; a run another process holds is left to it (status
    R.BUSY). Data-parallel, rank 0 alone holds the lock, writes and scores (the other ranks return 'trained').
    """
    run = plan_run(grid, row, seed, data)
    status, _ = claim_and_run(grid, run, data, on_step)
    return run.directory, status


def claim_and_run(
    grid: Grid, run: R.Run, data: PreparedData, on_step: Callable[[int], None] | None = None
) -> tuple[str, bool]:
    """run_one's work: the run's status, and whether this process trained it (False: it had ended, or is busy)."""
    directory, main = run.directory, grid.ranks.main
    done = from_main(ended(directory, grid.max_attempts) if main else None, grid.ranks)
    if done:
        return done, False
    if main:
        directory.mkdir(parents=True, exist_ok=True)
    with R.claim(directory) if main else nullcontext(True) as mine:
        if not from_main(mine, grid.ranks):
            return R.BUSY, False
        done = from_main(ended(directory, grid.max_attempts) if main else None, grid.ranks)  # ended while we looked
        if done:
            return done, False
        if main:
            prepare_directory(run)
        with sdpa_backend(run.settings.sdpa_backend):  # the attention kernel of the run's training and scoring
            return train_and_score(grid, run, data, on_step), True


def prepare_directory(run: R.Run) -> None:
    """Under the run's lock: clear what a killed writer left, set a damaged final.json aside, drop a failed one (retried)."""
    directory = run.directory
    R.remove_temporaries(directory)
    problem = R.final_problem(directory)
    if problem:
        aside = R.set_aside(directory / R.FINAL, "damaged")
        print(
            f"{run.label}: {directory / R.FINAL} is {problem}: set aside as {aside.name}; the run is done again",
            file=sys.stderr,
        )
    (directory / R.FINAL).unlink(missing_ok=True)  # only a failed result reaches here: it is retried
    R.write_json(directory / R.CONFIG, run.identity)


def train_and_score(grid: Grid, run: R.Run, data: PreparedData, on_step: Callable[[int], None] | None) -> str:
    """Build, train (resuming), score and record one run whose lock this process holds; returns its status.

    final.json's tokens_per_s and mfu are the steady state: the tokens of the steps that compiled nothing over
    their seconds. wall_s is every training step's seconds (compiling included; evaluation and checkpoints not), and
    wall_tokens_per_s and wall_mfu are the rates over it; compile_s and compiles say what compiling took.
    """
    directory, final = run.directory, blank_final(grid, run)
    try:
        torch.manual_seed(run.seed)
        model = load_model(grid.model_spec, config=run.config).to(grid.device)
        counts = count_parameters(model.parameter_groups())
        final["params"] = counts["total"]
        stream = BatchStream(
            data.train_src,
            data.train_tgt,
            run.settings.micro_tokens,
            run.seed,
            pad_multiple=run.settings.pad_multiple,
            pack=run.settings.pack,
        )
        state = train(model, run, stream, (data.dev_src, data.dev_tgt), grid.device, on_step, grid.ranks)
        if not grid.ranks.main:
            return "trained"
        add_rates(final, state, grid, run, counts)
        add_scores(final, model, data, grid, run)
    except Diverged as exc:  # every rank sees the same (summed) loss, so all ranks stop here together
        final.update(status="diverged", error=str(exc), steps=exc.step)
    except StorageError:  # the disk, not the run: nothing to record (it could not be written), the grid stops
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


def blank_final(grid: Grid, run: R.Run) -> dict:
    """final.json before training: the run's identity and provenance, its results empty, so every ending has all keys."""
    header = {k: v for k, v in run.identity.items() if k not in ("config", "train", "data")}
    return {
        **header,
        "status": "finished",
        "error": None,
        "dev_ppl": None,
        "bleu": None,
        "bleu_tokenized": None,
        "sacrebleu_signature": None,
        "params": None,
        "steps": 0,
        "tokens_seen": 0,
        "wall_s": None,
        "compile_s": None,
        "compiles": None,
        "tokens_per_s": None,
        "mfu": None,
        "wall_tokens_per_s": None,
        "wall_mfu": None,
        "gemm_fraction": None,
        "device": describe_device(grid.device, grid.ranks.world),
        "peak_card": None,
        "peak_flops": None,
        "ddp": grid.ranks.parallel,  # DistributedDataParallel, over the process group's backend (nccl, gloo)
        "dist_backend": backend(grid.ranks),
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": None,
        "config": run.config.to_dict(),
    }


def add_rates(final: dict, state: TrainState, grid: Grid, run: R.Run, counts: dict[str, int]) -> None:
    """Fill in the training's steps, times and rates, as MFU against the card's peak and as the share of this
    machine's GEMM rate, so that a run's speed reads beside its score."""
    cfg = run.config
    final.update(
        steps=state.step,
        tokens_seen=state.tokens_seen,
        wall_s=state.wall_s,
        compile_s=state.compile_s,
        compiles=state.compiles,
        tokens_per_s=state.steady_tokens / state.steady_s if state.steady_s else None,
        wall_tokens_per_s=state.tokens_seen / state.wall_s if state.wall_s else None,
    )
    card = peak(grid.device)
    if card:
        final.update(peak_card=card.card, peak_flops=card.flops)
        for rate, mfu in (("tokens_per_s", "mfu"), ("wall_tokens_per_s", "wall_mfu")):
            if final[rate]:  # about half the tokens are source, half target; tokens/s of all ranks
                half = final[rate] / 2
                final[mfu] = training_flops(cfg, counts, half, half) / (card.flops * grid.ranks.world)
    # What this machine's fp32 GEMMs reach now, on its threads: the step's share of it. On the CPU only: on a GPU one
    # small GEMM times the launch, not the card, and MFU against the card's peak is the figure.
    if final["tokens_per_s"] and grid.device.type == "cpu":
        half = final["tokens_per_s"] / 2
        final["gemm_fraction"] = throughput(cfg, counts, half, half, 1.0, gemm_flops(grid.device))["gemm_fraction"]


def add_scores(final: dict, model: nn.Module, data: PreparedData, grid: Grid, run: R.Run) -> None:
    """Fill in the trained model's dev perplexity and BLEU, the scores of Table 3 (section 6.2), and the seconds they
    took; the hypotheses are written beside final.json."""
    settings, label = run.settings, run.label
    started = time.perf_counter()
    final["dev_ppl"] = perplexity(
        model, data.dev_src, data.dev_tgt, grid.device, settings.micro_tokens, settings.autocast, progress=label
    )
    scores = dev_bleu(
        model,
        data.sp,
        data.dev_src,
        data.dev_refs,
        grid.device,
        settings.beam,
        settings.alpha,
        settings.extra_len,
        settings.autocast,
        max_tokens=settings.micro_tokens,
        progress=label,
    )
    final.update(
        bleu=scores.bleu,
        bleu_tokenized=scores.bleu_tokenized,
        sacrebleu_signature=scores.signature,
        eval_s=time.perf_counter() - started,
    )
    write_atomic(run.directory / R.HYPOTHESES, "".join(h + "\n" for h in scores.hypotheses))


def write_final(directory: Path, final: dict, ranks: Ranks) -> None:
    """final.json, dated; rank 0 alone writes it."""
    if ranks.main:
        final["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        R.write_final(directory, final)


def run_grid(grid: Grid, data: PreparedData) -> list[tuple[Path, str]]:
    """Every (row, seed) in the paper's order under one progress bar; returns each run's directory and status.

    Runs that already ended are skipped (the bar counts them); runs another process holds are left to it.
    """
    runs = [plan_run(grid, row, seed, data) for row in grid.rows for seed in grid.seeds]
    skipped = sum(ended(run.directory, grid.max_attempts) is not None for run in runs)
    if grid.ranks.main and skipped:
        print(
            f"{skipped} of {len(runs)} runs already ended (finished, diverged, or failed {grid.max_attempts} times): "
            f"skipped; {len(runs) - skipped} to run",
            file=sys.stderr,
        )
    outcomes = []
    with tqdm(
        runs, desc=f"grid {grid.budget.name}", unit="run", dynamic_ncols=True, disable=not grid.ranks.main
    ) as bar:
        for run in bar:
            bar.set_postfix(row=run.row, seed=run.seed, skipped=skipped)
            status, trained = claim_and_run(grid, run, data)
            if grid.device.type == "cuda":
                torch.cuda.empty_cache()  # hand back what a run that ran out of memory held before the next one starts
            if grid.ranks.main and (trained or status == R.BUSY):
                tqdm.write(outcome_line(run.row, run.seed, status, run.directory), file=sys.stderr)
            outcomes.append((run.directory, status))
    return outcomes
