"""Beam search as in the paper (section 6.1): beam 4, length penalty alpha 0.6, output up to source length + 50.

Batched over sentences and beams. With the model's KV cache each step feeds only the newest token;
a model that declares `kv_cache` unsupported is decoded by re-running the whole prefix each step
(the same result, slower). A hypothesis's score is log P(y) / lp(y), lp(y) = ((5 + |y|) / 6)^alpha
(Wu et al. 2016), |y| counting the EOS. A sentence stops once its `beam` best finished hypotheses
cannot be beaten by any live one (the tensor2tensor bound), or at its maximum length.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

from ablations.data.bpe import BOS, EOS, PAD
from model.protocol import Seq2SeqModel


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    return ((5 + length) / 6) ** alpha


def supports_kv_cache(model: Seq2SeqModel) -> bool:
    return "kv_cache" not in getattr(model, "unsupported", {})


@torch.no_grad()
def beam_search(
    model: Seq2SeqModel,
    src: Tensor,
    src_pad: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    extra_len: int = 50,
    use_cache: bool | None = None,
) -> list[list[int]]:
    """The best hypothesis (ids without BOS and EOS) for each source row of src (B, S)."""
    use_cache = supports_kv_cache(model) if use_cache is None else use_cache
    B, K, device = src.size(0), beam, src.device
    src_lens = (~src_pad).sum(1).tolist()
    limit = model.config.max_len - 1  # positions the decoder can take
    max_len = [min(n + extra_len, limit) for n in src_lens]
    shared = use_cache and getattr(model, "beams_share_memory", False)  # one memory row serves a sentence's K beams
    cache = model.new_cache(beams=K) if shared else model.new_cache() if use_cache else None
    memory, mem_pad = model.encode(src, src_pad), src_pad
    if not shared:
        memory, mem_pad = memory.repeat_interleave(K, dim=0), src_pad.repeat_interleave(K, dim=0)
    tokens = torch.full((B * K, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    first_row = torch.arange(B, device=device).unsqueeze(1) * K
    alive_first = torch.arange(2 * K, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    done = [False] * B
    for t in range(1, max(max_len) + 1):
        step_in = tokens[:, -1:] if cache is not None else tokens
        tgt_pad = torch.zeros_like(step_in, dtype=torch.bool)
        logits = model.decode(step_in, memory, mem_pad, tgt_pad, cache)[:, -1]  # (B*K, V)
        logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        top_scores, top_beam, top_tok = _best_continuations(logits, scores, K)
        is_eos = top_tok.eq(EOS)
        _collect_finished(finished, done, tokens, top_scores, top_beam, is_eos, K, t, alpha)
        # The K best continuations that do not end in EOS stay alive.
        keep = (is_eos.long() * 2 * K + alive_first).argsort(dim=1)[:, :K]
        scores = top_scores.gather(1, keep)
        rows = (top_beam.gather(1, keep) + first_row).view(-1)
        tokens = torch.cat([tokens.index_select(0, rows), top_tok.gather(1, keep).view(-1, 1)], dim=1)
        if cache is not None:
            cache.reorder(rows)
        best_alive = scores[:, 0].tolist()
        for b in range(B):
            if done[b]:
                continue
            if t >= max_len[b]:  # out of length: the live hypotheses compete as they are
                for k in range(K):
                    finished[b].append((scores[b, k].item() / length_penalty(t, alpha), tokens[b * K + k, 1:].tolist()))
                done[b] = True
            elif len(finished[b]) >= K:
                worst_kept = sorted(s for s, _ in finished[b])[-K]
                done[b] = worst_kept >= best_alive[b] / length_penalty(max_len[b], alpha)
        if all(done):
            break
    return [max(f, key=lambda item: item[0])[1] for f in finished]


def _best_continuations(logits: Tensor, scores: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best (score + log P(token)) over each sentence's K beams and the vocabulary, PAD and BOS excluded:
    (scores, beam, token), each (B, 2K). At most K of them end in EOS (one per beam), so K others stay alive.

    Only each beam's own 2K best tokens can be among its sentence's 2K best, so those are taken first and no
    (B, K*V) table of scores is built.
    """
    B = scores.size(0)
    logp = torch.log_softmax(logits, dim=-1)
    logp[:, PAD] = logp[:, BOS] = float("-inf")
    n = min(2 * K, logp.size(-1))
    best, token = logp.topk(n, dim=-1)  # (B*K, n)
    top_scores, index = (scores.view(-1, 1) + best).view(B, K * n).topk(2 * K, dim=1)
    return top_scores, torch.div(index, n, rounding_mode="floor"), token.view(B, K * n).gather(1, index)


def _collect_finished(finished, done, tokens, top_scores, top_beam, is_eos, K: int, t: int, alpha: float) -> None:
    """Hypotheses whose EOS ranks among the K best candidates of a live sentence are finished."""
    for b, j in is_eos[:, :K].nonzero().tolist():
        if done[b]:
            continue
        row = b * K + top_beam[b, j].item()
        finished[b].append((top_scores[b, j].item() / length_penalty(t, alpha), tokens[row, 1:].tolist()))


def translate(
    model: Seq2SeqModel,
    src_ids: list[list[int]],
    device: torch.device,
    max_tokens: int = 2000,
    beam: int = 4,
    alpha: float = 0.6,
    extra_len: int = 50,
    autocast: torch.dtype | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Beam search over many sentences in batches of similar length; results in the input order.
    on_batch, if given, is called with the number of sentences each batch translated (a progress bar's update)."""
    if not supports_kv_cache(model):
        warnings.warn(
            f"model has no KV cache ({model.unsupported['kv_cache']}); beam search re-decodes the whole prefix at each step (slower, same result)",
            stacklevel=2,
        )
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    out: list[list[int]] = [[] for _ in src_ids]
    model.eval()
    start = 0
    while start < len(order):
        end = start + 1  # sorted by length: the last sentence taken is the longest
        while end < len(order) and (end - start + 1) * len(src_ids[order[end]]) <= max_tokens:
            end += 1
        chosen = order[start:end]
        src = torch.full((len(chosen), len(src_ids[chosen[-1]])), PAD, dtype=torch.long)
        for r, i in enumerate(chosen):
            src[r, : len(src_ids[i])] = torch.tensor(src_ids[i])
        src = src.to(device)
        with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            hyps = beam_search(model, src, src.eq(PAD), beam, alpha, extra_len)
        for i, hyp in zip(chosen, hyps):
            out[i] = hyp
        if on_batch is not None:
            on_batch(len(chosen))
        start = end
    return out
