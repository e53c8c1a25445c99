"""Beam search: the cached and full-prefix paths agree, beam 1 is greedy, the length penalty ranks as Wu et al. define."""

import math
from dataclasses import dataclass

import pytest
import torch

from ablations.data.bpe import BOS, EOS, PAD
from ablations.scoring.decoding import beam_search, length_penalty, searched_model, translate
from model import Transformer, TransformerConfig

TINY = TransformerConfig(N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8, vocab_size=40, max_len=64, P_drop=0.0)
A, B = 4, 5  # token ids of the scripted model below


def random_sources(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, TINY.vocab_size, (rows, length), generator=g)
    src[:, -1] = EOS
    src[0, length - 3 :] = torch.tensor([EOS, PAD, PAD])  # one shorter, padded source
    return src, src.eq(PAD)


def greedy(model, src, src_pad, max_new: int) -> list[list[int]]:
    """Argmax decoding by re-running the whole prefix, stopping at EOS: the reference for beam 1."""
    memory = model.encode(src, src_pad)
    out = []
    for b in range(src.size(0)):
        tokens = [BOS]
        limit = int((~src_pad[b]).sum()) + max_new
        while len(tokens) - 1 < limit:
            logits = model.decode(
                torch.tensor([tokens]),
                memory[b : b + 1],
                src_pad[b : b + 1],
                torch.zeros(1, len(tokens), dtype=torch.bool),
            )
            logp = torch.log_softmax(logits[0, -1], -1)
            logp[PAD] = logp[BOS] = -math.inf
            nxt = int(logp.argmax())
            if nxt == EOS:
                break
            tokens.append(nxt)
        out.append(tokens[1:])
    return out


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(TINY).double().eval()


def test_cached_and_full_prefix_beam_search_give_the_same_hypotheses(model):
    # float64 so that the two paths' logits agree to ~1e-15 and no near-tie can flip a choice.
    src, src_pad = random_sources(3, 7, seed=1)
    cached = beam_search(model, src, src_pad, beam=4, alpha=0.6, extra_len=6, use_cache=True)
    full = beam_search(model, src, src_pad, beam=4, alpha=0.6, extra_len=6, use_cache=False)
    assert cached == full
    assert all(len(h) <= int(n) + 6 for h, n in zip(cached, (~src_pad).sum(1)))


def test_beams_sharing_one_memory_row_find_the_same_hypotheses_as_beams_with_copies(model):
    src, src_pad = random_sources(3, 7, seed=4)
    shared = beam_search(model, src, src_pad, beam=4, alpha=0.6, extra_len=6)
    copies = Transformer(TINY).double().eval()
    copies.load_state_dict(model.state_dict())
    copies.beams_share_memory = False  # the memory repeated per beam, its keys and values reordered every step
    assert shared == beam_search(copies, src, src_pad, beam=4, alpha=0.6, extra_len=6)


def test_beam_of_one_is_greedy_decoding(model):
    src, src_pad = random_sources(3, 6, seed=2)
    assert beam_search(model, src, src_pad, beam=1, alpha=0.6, extra_len=5) == greedy(model, src, src_pad, 5)


def test_length_penalty_is_wu_et_al():
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(11, 0.6) == pytest.approx((16 / 6) ** 0.6)


@dataclass
class Scripted:
    """A model whose next-token probabilities depend only on the prefix, from a table: the best answer is known.

    After BOS: A 0.5, B 0.4, EOS 0.1. After A: A, B, EOS a third each. After B: EOS 0.97. Greedy takes A;
    beam search with 2 beams finds [B] (log 0.4 + log 0.97 beats every continuation of A).
    """

    config: TransformerConfig = TransformerConfig(vocab_size=6, max_len=64)
    unsupported = {"kv_cache": "scripted test model"}

    def encode(self, src, src_pad):
        return torch.zeros(src.size(0), src.size(1), 1)

    def decode(self, tgt, memory, src_pad, tgt_pad, cache=None):
        rows = []
        for prefix in tgt.tolist():
            last = prefix[-1]
            probs = {BOS: {A: 0.5, B: 0.4, EOS: 0.1}, A: {A: 1 / 3, B: 1 / 3, EOS: 1 / 3}, B: {EOS: 0.97, A: 0.03}}[
                last
            ]
            row = torch.full((6,), 1e-9)
            for tok, p in probs.items():
                row[tok] = p
            rows.append(row.log())
        return torch.stack(rows)[:, None, :].expand(-1, tgt.size(1), -1)

    def eval(self):
        return self


def test_beam_search_finds_the_better_hypothesis_that_greedy_misses():
    src = torch.tensor([[7, EOS]])
    assert beam_search(Scripted(), src, src.eq(PAD), beam=2, alpha=0.6, extra_len=3)[0] == [B]
    assert beam_search(Scripted(), src, src.eq(PAD), beam=1, alpha=0.6, extra_len=3)[0][0] == A


def test_a_model_without_kv_cache_is_decoded_with_a_notice():
    with pytest.warns(UserWarning, match="no KV cache .*re-decodes the whole prefix"):
        out = translate(Scripted(), [[7, EOS], [8, 9, EOS]], torch.device("cpu"), beam=2, extra_len=3)
    assert out == [[B], [B]]


def test_on_a_gpu_asked_for_bf16_the_search_runs_a_bf16_copy_without_autocast_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = Transformer(TINY)
    searched, autocast = searched_model(model, torch.device("cuda"), torch.bfloat16)
    assert autocast is None and searched is not model
    assert {p.dtype for p in searched.parameters()} == {torch.bfloat16}
    assert searched.generator.weight is searched.src_embed.weight  # the one embedding matrix stays one
    assert torch.equal(searched.src_embed.weight, model.src_embed.weight.bfloat16())
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert searched_model(model, torch.device("cpu"), torch.bfloat16) == (model, torch.bfloat16)
    assert searched_model(model, torch.device("cuda"), None) == (model, None)
    src, src_pad = random_sources(3, 7, seed=1)
    assert len(beam_search(searched.eval(), src, src_pad, beam=4, extra_len=5)) == 3
