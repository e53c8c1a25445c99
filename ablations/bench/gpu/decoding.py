"""The GPU benchmark's beam search (python -m ablations.bench.gpu runs it): the reference's beam_search beside HF
generate, fresh models of the same size, searches interleaved, under the time limit's alarm."""

from __future__ import annotations

import statistics
from typing import Callable

import torch
from tqdm.auto import tqdm

from ablations.bench import peers
from ablations.bench.gpu.timing import MEASURED, TIME_UP, Deadline, failure, synced
from ablations.bench.workload import alternate
from ablations.data.bpe import PAD
from ablations.scoring.decoding import beam_search, searched_model
from ablations.training.backends import sdpa_backend
from model import Transformer, TransformerConfig


def reference_search(
    model: torch.nn.Module, src: torch.Tensor, extra: int, autocast: torch.dtype | None
) -> Callable[[], int]:
    """Beam 4 by the reference's beam_search (up to source length + extra); the call returns the output tokens."""

    def run() -> int:
        with torch.autocast(src.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return sum(len(h) + 1 for h in beam_search(model, src, src.eq(PAD), beam=4, extra_len=extra))

    return run


def hf_search(
    model: torch.nn.Module, src: torch.Tensor, length: int, autocast: torch.dtype | None
) -> Callable[[], int]:
    """Beam 4 by HF generate, forced to `length` new tokens; the call returns the output tokens."""
    generate = peers.hf_generate(model)

    def run() -> int:
        with torch.autocast(src.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            generate(src, 4, length)
        return src.size(0) * length

    return run


def build_searches(
    cfg: TransformerConfig,
    systems: set[str],
    src: torch.Tensor,
    extra: int,
    autocast: torch.dtype | None,
    device: torch.device,
) -> dict[str, Callable[[], int]]:
    """Beam search by fresh (untrained) models of those `systems` that decode here, the reference and HF MarianMT: a
    model trained for a few steps soon ends every hypothesis at once, which would leave nothing to time. Both search
    as `translate` searches: on a GPU in bf16, a copy of the model with bf16 weights, no autocast (`searched_model`)."""
    searches = {}
    torch.manual_seed(0)
    if "reference" in systems:
        ours, ours_autocast = searched_model(Transformer(cfg).to(device), device, autocast)
        searches["reference beam_search"] = reference_search(ours.eval(), src, extra, ours_autocast)
    marian = peers.hf_marian(cfg) if "hf-marian" in systems else None
    if marian is not None:
        theirs, their_autocast = searched_model(marian.to(device), device, autocast)
        searches["HF MarianMT generate"] = hf_search(theirs.eval(), src, src.size(1) + extra, their_autocast)
    return searches


def time_decoding(
    size: str,
    searches: dict[str, Callable[[], int]],
    reps: int,
    backend: str,
    device: torch.device,
    deadline: Deadline,
) -> list[dict]:
    """One untimed search per system, then `reps` interleaved timed ones; the time limit's alarm ends them where they
    are, and the searches timed before it are reported."""
    times: dict[str, list[float]] = {name: [] for name in searches}
    tokens, status = dict.fromkeys(searches, 0), dict.fromkeys(searches, MEASURED)
    with torch.no_grad(), sdpa_backend(backend), deadline.until_limit():
        for i in tqdm(range(reps + 1), desc="beam search", unit="rep", leave=False):
            for name, run in alternate(searches.items(), i):
                if status[name] != MEASURED:
                    continue
                try:
                    start = synced(device)
                    tokens[name] = run()
                    seconds = synced(device) - start
                except Exception as exc:  # noqa: BLE001
                    if deadline.rang(exc):
                        raise
                    status[name] = failure(exc, backend)
                    continue
                if i:  # the first search of each system is warm-up
                    times[name].append(seconds)
    rows = []
    for name, t in times.items():
        s = statistics.median(t) if t and status[name] == MEASURED else None
        rows.append(
            {
                "size": size,
                "system": name,
                "status": status[name] if status[name] != MEASURED or s else TIME_UP,
                "reps": len(t),
                "s": s,
                "output_tokens": tokens[name],
                "output_tokens_per_s": tokens[name] / s if s else None,
            }
        )
    return rows
