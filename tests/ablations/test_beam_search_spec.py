"""Beam search kept on the device finds what the host-side beam search found: the same hypotheses, the same scores.

`host_beam_search` below is the search as it was before its bookkeeping moved to the device (finished hypotheses in
Python lists, read back at every step): it is the specification. It returns each sentence's best (score, tokens)
instead of its tokens only, so that the scores are compared too. Its scores are float64 divisions of the values it
read; the device search divides the same values in float64, so they agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import Tensor

from ablations.data.bpe import BOS, EOS, PAD, UNK
from ablations.scoring import decoding
from ablations.scoring.decoding import beam_search, length_penalty, supports_kv_cache
from model import Transformer, kernels
from tests.ablations.test_decoding import TINY, A, B, Scripted


@torch.no_grad()
def host_beam_search(model, src, src_pad, beam=4, alpha=0.6, extra_len=50, use_cache=None) -> list[tuple[float, list]]:
    """The beam search before this file's change, verbatim but for what it returns: (score, tokens) per sentence."""
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
        top_scores, top_beam, top_tok = best_continuations(logits, scores, K)
        is_eos = top_tok.eq(EOS)
        collect_finished(finished, done, tokens, top_scores, top_beam, is_eos, K, t, alpha)
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
    return [max(f, key=lambda item: item[0]) for f in finished]


def best_continuations(logits: Tensor, scores: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
    B = scores.size(0)
    logp = torch.log_softmax(logits, dim=-1)
    logp[:, PAD] = logp[:, BOS] = float("-inf")
    n = min(2 * K, logp.size(-1))
    best, token = logp.topk(n, dim=-1)  # (B*K, n)
    top_scores, index = (scores.view(-1, 1) + best).view(B, K * n).topk(2 * K, dim=1)
    return top_scores, torch.div(index, n, rounding_mode="floor"), token.view(B, K * n).gather(1, index)


def collect_finished(finished, done, tokens, top_scores, top_beam, is_eos, K: int, t: int, alpha: float) -> None:
    for b, j in is_eos[:, :K].nonzero().tolist():
        if done[b]:
            continue
        row = b * K + top_beam[b, j].item()
        finished[b].append((top_scores[b, j].item() / length_penalty(t, alpha), tokens[row, 1:].tolist()))


def device_beam_search(model, src, src_pad, **kwargs) -> list[tuple[float, list]]:
    """beam_search's hypotheses, with the best scores it kept on the device."""
    kept: list[float] = []
    results = decoding.Finished.results

    def with_scores(finished: decoding.Finished) -> list[list[int]]:
        kept.extend(finished.best.tolist())
        return results(finished)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding.Finished, "results", with_scores)
        hyps = beam_search(model, src, src_pad, **kwargs)
    return list(zip(kept, hyps))


def sources(lengths: list[int], seed: int, left: bool = False) -> tuple[Tensor, Tensor]:
    """Rows of these lengths (EOS last), padded on the right, or on the left."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    src = torch.full((len(lengths), width), PAD)
    for r, n in enumerate(lengths):
        start = width - n if left else 0
        src[r, start : start + n - 1] = torch.randint(4, TINY.vocab_size, (n - 1,), generator=g)
        src[r, start + n - 1] = EOS
    return src, src.eq(PAD)


def tiny(seed: int, dtype: torch.dtype = torch.float64, chain: float = 3.0, eos: float = 0.0, **changes) -> Transformer:
    """A tiny untrained model, whose logits get a random Markov chain's added (next token by the last, scaled by
    `chain`; EOS's column shifted by `eos`): so EOS is likely after some tokens, and hypotheses end at many lengths."""
    torch.manual_seed(seed)
    model = Transformer(TINY.replace(**changes)).to(dtype).eval()
    after = torch.randn(TINY.vocab_size, TINY.vocab_size, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    after = after * chain
    after[:, EOS] += eos
    decode = model.decode
    model.decode = lambda tgt, *args: decode(tgt, *args) + after[tgt]
    return model


class SmallVocabulary(Scripted):
    """The scripted model, whose hypotheses that went on with a token of no chance (PAD, BOS: -inf) or EOS go on as
    after A: with beam 4 over 6 tokens such hypotheses rank among the 2K best, stay alive and may finish."""

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        return super().decode(torch.where(torch.isin(tgt, torch.tensor([BOS, A, B])), tgt, A), memory, src_pad, tgt_pad)


@dataclass
class ByPrefix(Scripted):
    """The scripted model with its next-token probabilities given by a function of the whole prefix."""

    probs: Callable[[list[int]], dict[int, float]] = lambda prefix: {EOS: 1.0}

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        rows = torch.full((tgt.size(0), 6), 1e-9)
        for r, prefix in enumerate(tgt.tolist()):
            for tok, p in self.probs(prefix).items():
                rows[r, tok] = p
        return rows.log()[:, None, :].expand(-1, tgt.size(1), -1)


CASES = {  # name: (model's changes, sources' lengths, search's keywords)
    "beam 4": (dict(), [7, 5, 7], dict(beam=4, extra_len=6)),
    "beam 1": (dict(), [6, 4, 6], dict(beam=1, extra_len=5)),
    "beam 2, alpha 1": (dict(), [5, 8], dict(beam=2, alpha=1.0, extra_len=4)),
    "beam 3, alpha 0": (dict(chain=2.0), [4, 6, 2], dict(beam=3, alpha=0.0, extra_len=7)),
    "late EOS": (dict(eos=-2.0), [9, 3, 6, 6, 1], dict(beam=4, extra_len=9)),
    "early EOS": (dict(eos=2.0), [9, 3, 6, 6, 1], dict(beam=4, extra_len=9)),
    "early EOS, beam 1": (dict(eos=2.0), [9, 3, 6], dict(beam=1, extra_len=9)),
    "longest output capped by max_len": (dict(max_len=10, eos=-2.0), [7, 4], dict(beam=4, extra_len=50)),
    "no KV cache": (dict(), [7, 5], dict(beam=4, extra_len=5, use_cache=False)),
    "float32": (dict(dtype=torch.float32), [7, 5, 6], dict(beam=4, extra_len=6)),
    "float32, late EOS": (dict(dtype=torch.float32, eos=-2.0), [8, 2, 5], dict(beam=4, extra_len=8)),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("left", [False, True], ids=["right padding", "left padding"])
@pytest.mark.parametrize("case", list(CASES))
def test_device_search_finds_the_host_searchs_hypotheses_and_scores(case, left, seed):
    changes, lengths, search = CASES[case]
    model, (src, src_pad) = tiny(seed, **changes), sources(lengths, seed + 10, left)
    assert device_beam_search(model, src, src_pad, **search) == host_beam_search(model, src, src_pad, **search)


@pytest.mark.parametrize("beam", [1, 2, 4])
def test_device_search_with_the_memory_per_beam_finds_the_host_searchs(beam):
    model, (src, src_pad) = tiny(3), sources([7, 4, 6], seed=5)
    model.beams_share_memory = False  # the memory repeated per beam, its keys and values reordered every step
    expected = host_beam_search(model, src, src_pad, beam=beam, extra_len=6)
    assert device_beam_search(model, src, src_pad, beam=beam, extra_len=6) == expected


@pytest.mark.parametrize("beam", [1, 2, 4, 5])
def test_device_search_finds_the_host_searchs_with_a_scripted_model_and_candidates_of_no_chance(beam):
    # Vocabulary 6: with beam 4 a beam's 2K best tokens include PAD and BOS at -inf, which may rank and even finish.
    src = torch.tensor([[7, 8, EOS], [9, EOS, PAD]])
    expected = host_beam_search(SmallVocabulary(), src, src.eq(PAD), beam=beam, extra_len=3)
    assert device_beam_search(SmallVocabulary(), src, src.eq(PAD), beam=beam, extra_len=3) == expected


def test_cache_rows_gathered_as_on_a_gpu_give_the_host_searchs_hypotheses(monkeypatch):
    # On a GPU the kernel does not apply: the cache gathers every row into spare buffers instead.
    model, (src, src_pad) = tiny(4), sources([8, 5, 7], seed=6)
    expected = host_beam_search(model, src, src_pad, beam=4, extra_len=8)
    monkeypatch.setattr(kernels, "reorder_rows", lambda *args: False)
    for memory_per_beam in (False, True):
        model.beams_share_memory = not memory_per_beam
        assert device_beam_search(model, src, src_pad, beam=4, extra_len=8) == expected


def test_a_cache_reserved_for_the_longest_output_never_reallocates_its_buffers():
    # Unreserved, the buffers would be reallocated (and the past copied) at 17 positions.
    model, (src, src_pad) = tiny(0), sources([5, 5], seed=1)
    cache, memory = model.new_cache(), model.encode(src, src_pad)
    cache.reserve(24)
    tokens, no_pad = torch.full((2, 1), BOS), torch.zeros(2, 1, dtype=torch.bool)
    with torch.no_grad():
        model.decode(tokens, memory, src_pad, no_pad, cache)
        storage = {name: k.data_ptr() for name, (k, _) in cache.kv.items() if name.startswith("decoder_self")}
        for _ in range(23):
            model.decode(tokens, memory, src_pad, no_pad, cache)
    assert storage and all(cache.kv[name][0].data_ptr() == p for name, p in storage.items())
    assert cache.length == 24


@pytest.mark.parametrize("beam", [2, 4])
def test_of_hypotheses_of_equal_score_the_first_finished_is_kept(beam):
    # At the last step (max length 2) [A] + EOS and [A, UNK] have the same score: the EOS one was found first.
    model = ByPrefix(
        probs=lambda p: {A: 0.45, B: 0.45, EOS: 0.1} if len(p) == 1 else {EOS: 0.3, UNK: 0.3, A: 0.2, B: 0.2}
    )
    src = torch.tensor([[EOS]])
    expected = host_beam_search(model, src, src.eq(PAD), beam=beam, extra_len=1)
    assert device_beam_search(model, src, src.eq(PAD), beam=beam, extra_len=1) == expected


def test_a_sentence_out_of_length_collects_nothing_while_longer_ones_go_on():
    # Sentence 0 stops at 3 tokens; at step 4 its [A, A, A] + EOS would score better (lp grows), but comes too late.
    model = ByPrefix(probs=lambda p: {A: 0.5, B: 0.5 - 1e-6, EOS: 1e-6} if len(p) <= 3 else {EOS: 0.999})
    src = torch.tensor([[EOS, PAD, PAD, PAD, PAD], [A, A, A, A, EOS]])
    expected = host_beam_search(model, src, src.eq(PAD), beam=2, extra_len=2)
    assert device_beam_search(model, src, src.eq(PAD), beam=2, extra_len=2) == expected


def test_a_sentence_whose_only_finished_hypotheses_have_no_chance_returns_the_first():
    finished = decoding.Finished.empty(1, 2, 3, [3], 0.6, torch.device("cpu"))
    tokens = torch.tensor([[BOS, A, B, PAD], [BOS, B, B, PAD]])
    no_chance = torch.full((1, 2), float("-inf"))
    step = torch.tensor(2)
    finished.offer(no_chance, torch.ones(1, 2, dtype=torch.bool), tokens, torch.tensor([[1, 0]]), t=step, length=step)
    assert finished.results() == [[B, B]]  # as max() over [(-inf, [B, B]), (-inf, [A, B])] takes it
