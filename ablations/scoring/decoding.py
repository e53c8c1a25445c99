"""Beam search as in the paper (section 6.1): beam 4, length penalty alpha 0.6, output up to source length + 50.

Batched over sentences and beams. With the model's KV cache each step feeds only the newest token;
a model that declares `kv_cache` unsupported is decoded by re-running the whole prefix each step
(the same result, slower). A hypothesis's score is log P(y) / lp(y), lp(y) = ((5 + |y|) / 6)^alpha
(Wu et al. 2016), |y| counting the EOS. A sentence stops once its `beam` best finished hypotheses
cannot be beaten by any live one (the tensor2tensor bound), or at its maximum length.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ablations.data.bpe import BOS, EOS, PAD
from ablations.scoring.graphs import captured
from model.params import working_copy
from model.protocol import Seq2SeqModel


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    return ((5 + length) / 6) ** alpha


def supports_kv_cache(model: Seq2SeqModel) -> bool:
    return "kv_cache" not in getattr(model, "unsupported", {})


DONE_CHECK_EVERY = 8  # decoding steps between the host's looks at whether every sentence is done (a GPU wait)


def at_fixed_shapes(model: Seq2SeqModel, device: torch.device) -> bool:
    """Whether the search decodes with a fixed-shape cache (`KVCache.fix_shapes`): on a GPU, where its steps can then
    be replayed as a CUDA graph, a model that takes it (`Transformer.decodes_at_fixed_shapes`)."""
    return device.type == "cuda" and getattr(model, "decodes_at_fixed_shapes", False)


def graphs_apply(device: torch.device) -> bool:
    """Whether fixed-shape steps are captured as a CUDA graph (`ablations.scoring.graphs`): not under autocast, whose
    cache of cast weights a graph cannot hold (the GPU's search runs a bf16 copy without it: `searched_model`)."""
    return device.type == "cuda" and not torch.is_autocast_enabled(device.type)


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
    """The best hypothesis (ids without BOS and EOS) for each source row of src (B, S).

    Built not to make a GPU wait: a decoding step reads no tensor's value on the host. The finished hypotheses and the
    done flags stay on the device (`Finished`), the tokens live in one buffer as long as the longest output, and the KV
    cache is sized once and reordered by gathers. On a GPU the reference decodes at fixed shapes, and every step
    after the second replays the second, captured as a CUDA graph (`ablations.scoring.graphs`). The host reads the
    source lengths before the first step, whether every sentence is done once every DONE_CHECK_EVERY steps (so up to
    DONE_CHECK_EVERY - 1 steps may run after the last sentence is done; they change nothing), and the results after
    the last step.
    """
    use_cache = supports_kv_cache(model) if use_cache is None else use_cache
    B, K, device = src.size(0), beam, src.device
    src_lens = (~src_pad).sum(1).tolist()
    limit = model.config.max_len - 1  # positions the decoder can take
    max_len = [min(n + extra_len, limit) for n in src_lens]
    steps = max(max_len)
    shared = use_cache and getattr(model, "beams_share_memory", False)  # one memory row serves a sentence's K beams
    cache = model.new_cache(beams=K) if shared else model.new_cache() if use_cache else None
    if cache is not None:
        cache.reserve(steps)
    fixed = cache is not None and at_fixed_shapes(model, device)
    if fixed:
        cache.fix_shapes(device)
    memory, mem_pad = model.encode(src, src_pad), src_pad
    if not shared:
        memory, mem_pad = memory.repeat_interleave(K, dim=0), src_pad.repeat_interleave(K, dim=0)
    beams = Beams.start(B, K, steps, torch.float64 if memory.dtype == torch.float64 else torch.float32, device)
    tgt_pad = torch.zeros(B * K, 1 if cache is not None else steps, dtype=torch.bool, device=device)
    finished = Finished.empty(B, K, steps, max_len, alpha, device)

    def take_step(t: int | None) -> None:
        """Step t of the search, in place on `beams`, `finished` and the cache: the cache reordered by the last step's
        survivors, the next token's logits, the hypotheses that finish and those that go on. Everything that changes
        from step to step is read from the device (`beams.t`), so that a captured step (t None: any step) replays as
        any later one; a step known to come before the shortest sentence's length skips the out-of-length offer."""
        if cache is not None:
            cache.reorder(beams.rows)
            if fixed:
                cache.position.copy_(beams.t.view(1) - 1)
        step_in = beams.tokens.index_select(1, beams.t.view(1) - 1) if cache is not None else beams.tokens[:, :t]
        logits = model.decode(step_in, memory, mem_pad, tgt_pad[:, : step_in.size(1)], cache)[:, -1]  # (B*K, V)
        beams.advance(logits, finished, out_of_length_possible=t is None or t >= min(max_len))

    replay = None
    for t in range(1, steps + 1):
        if replay is not None:
            replay()
        elif fixed and t == 2 and steps > 2 and graphs_apply(device):  # the first step fills the memory's keys, values
            replay = captured(lambda: take_step(None), device)
        else:
            take_step(t)
        if t % DONE_CHECK_EVERY == 0 and bool(finished.done.all()):
            break
    return finished.results()


@dataclass
class Beams:
    """The live hypotheses of a search (B sentences, beam K), updated in place at each step: a captured step reads and
    writes the same tensors at every replay."""

    t: Tensor  # () long: the step to take next, from 1
    scores: Tensor  # (B, K): each live hypothesis's log P
    rows: Tensor  # (B*K,): the rows of the last step's hypotheses that the live ones continue (the cache's reorder)
    tokens: Tensor  # (B*K, steps + 1): BOS, then one column per step
    first_row: Tensor  # (B, 1): each sentence's first row
    alive_first: Tensor  # (2K,)
    own_rows: Tensor  # (B, K): each beam's row of tokens

    @classmethod
    def start(cls, B: int, K: int, steps: int, dtype: torch.dtype, device: torch.device) -> Beams:
        """The search before its first step; `dtype` that of the scores: the logits', at least float32."""
        tokens = torch.full((B * K, steps + 1), PAD, dtype=torch.long, device=device)
        tokens[:, 0] = BOS
        scores = torch.full((B, K), float("-inf"), dtype=dtype, device=device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        return cls(
            t=torch.ones((), dtype=torch.long, device=device),
            scores=scores,
            rows=torch.arange(B * K, device=device),
            tokens=tokens,
            first_row=torch.arange(B, device=device).unsqueeze(1) * K,
            alive_first=torch.arange(2 * K, device=device),
            own_rows=torch.arange(B * K, device=device).view(B, K),
        )

    def advance(self, logits: Tensor, finished: Finished, out_of_length_possible: bool = True) -> None:
        """Step t given its logits (B*K, V): the hypotheses that end in EOS offered to `finished`, the K best that do
        not kept, those out of length offered as they are (where `out_of_length_possible`), and t moved on."""
        B, K = self.scores.shape
        logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        top_scores, top_beam, top_tok = _best_continuations(logits, self.scores, K)
        live = ~finished.done  # a sentence done at an earlier step collects nothing more
        is_eos = top_tok.eq(EOS)
        # An EOS among a sentence's K best candidates finishes that hypothesis (its tokens before this step's).
        eos_rows = top_beam[:, :K] + self.first_row
        finished.offer(top_scores[:, :K], is_eos[:, :K] & live.unsqueeze(1), self.tokens, eos_rows, self.t, self.t - 1)
        # The K best continuations that do not end in EOS stay alive.
        keep = (is_eos.long() * 2 * K + self.alive_first).argsort(dim=1)[:, :K]
        self.scores.copy_(top_scores.gather(1, keep))
        self.rows.copy_((top_beam.gather(1, keep) + self.first_row).view(-1))
        self.tokens.copy_(self.tokens.index_select(0, self.rows))
        self.tokens.index_copy_(1, self.t.view(1), top_tok.gather(1, keep).view(-1, 1))
        out_of_length = live & finished.max_len.le(self.t)
        if out_of_length_possible:  # out of length: the live hypotheses compete as they are
            every_beam = out_of_length.unsqueeze(1).expand(B, K)
            finished.offer(self.scores, every_beam, self.tokens, self.own_rows, self.t, self.t)
        finished.settle(live, out_of_length, self.scores[:, 0])
        self.t.add_(1)


@dataclass
class Finished:
    """Each sentence's finished hypotheses as beam search needs them, kept on the device (B sentences, beam K).

    Not the list of them but: the best (score and tokens; of equal scores the first found, as max() over the list in
    order of finding takes it), the K best scores (a sentence is done once the K-th beats every live hypothesis) and
    their number. A score is log P(y) / lp(y) in float64, as the host used to compute it from each value it read.
    """

    best: Tensor  # (B,) float64: the best score so far
    tokens: Tensor  # (B, steps + 1) long: its tokens, BOS first
    length: Tensor  # (B,) long: how many of them follow BOS
    top: Tensor  # (B, K) float64: the K best scores, descending; -inf where fewer were found
    count: Tensor  # (B,) long: hypotheses finished
    done: Tensor  # (B,) bool
    max_len: Tensor  # (B,) long: each sentence's longest output
    bound: Tensor  # (B,) float64: lp(max_len), the largest length penalty a live hypothesis can still get
    alpha: float

    @classmethod
    def empty(cls, B: int, K: int, steps: int, max_len: list[int], alpha: float, device: torch.device) -> Finished:
        return cls(
            best=torch.full((B,), float("-inf"), dtype=torch.float64, device=device),
            tokens=torch.full((B, steps + 1), PAD, dtype=torch.long, device=device),
            length=torch.zeros(B, dtype=torch.long, device=device),
            top=torch.full((B, K), float("-inf"), dtype=torch.float64, device=device),
            count=torch.zeros(B, dtype=torch.long, device=device),
            done=torch.zeros(B, dtype=torch.bool, device=device),
            max_len=torch.tensor(max_len, device=device),
            bound=torch.tensor([length_penalty(n, alpha) for n in max_len], dtype=torch.float64, device=device),
            alpha=alpha,
        )

    def offer(self, logp: Tensor, valid: Tensor, tokens: Tensor, rows: Tensor, t: Tensor, length: Tensor) -> None:
        """Finish the hypotheses where `valid` (B, M), in order of M: log P(y) `logp` (B, M), found at step t; their
        tokens are the first `length` after BOS of rows `rows` (B, M) of `tokens`. In place (`Beams`)."""
        score = logp.double() / length_penalty(t.double(), self.alpha)
        offered = score.masked_fill(~valid, float("-inf"))
        best = offered.max(dim=1).values
        first = (valid & score.eq(best.unsqueeze(1))).long().argmax(dim=1)  # argmax: the first of the largest
        take = valid.any(dim=1) & (self.count.eq(0) | best.gt(self.best))
        row = rows.gather(1, first.unsqueeze(1)).squeeze(1)
        self.best.copy_(torch.where(take, best, self.best))
        self.tokens.copy_(torch.where(take.unsqueeze(1), tokens.index_select(0, row), self.tokens))
        self.length.copy_(torch.where(take, length, self.length))  # masked_fill_ would read a tensor value back
        self.top.copy_(torch.cat([self.top, offered], dim=1).topk(self.top.size(1), dim=1).values)
        self.count.add_(valid.sum(dim=1))

    def settle(self, live: Tensor, out_of_length: Tensor, best_alive: Tensor) -> None:
        """Mark done the live sentences out of length, and those whose K-th best finished score no live hypothesis
        can beat: its log P only falls, and lp grows to lp(max_len) at most (the tensor2tensor bound)."""
        unbeatable = self.count.ge(self.top.size(1)) & self.top[:, -1].ge(best_alive.double() / self.bound)
        self.done.logical_or_(live & (out_of_length | unbeatable))

    def results(self) -> list[list[int]]:
        """Each sentence's best hypothesis, read back (the search's last read)."""
        return [row[1 : 1 + n] for row, n in zip(self.tokens.tolist(), self.length.tolist())]


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


def searched_model(
    model: Seq2SeqModel, device: torch.device, autocast: torch.dtype | None
) -> tuple[Seq2SeqModel, torch.dtype | None]:
    """The model beam search runs, and the autocast it runs under. On a GPU, asked for a 16-bit dtype, a copy of the
    model with its weights in that dtype and no autocast: a search's steps are bound by the host's kernel launches,
    and autocast casts every weight again at every step."""
    if autocast is None or device.type != "cuda" or not isinstance(model, torch.nn.Module):
        return model, autocast
    return working_copy(model, autocast), None


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
    model, autocast = searched_model(model, device, autocast)
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
