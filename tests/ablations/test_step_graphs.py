"""Beam search at fixed shapes, and with its steps replayed as a CUDA graph, finds what the search finds without them.

On a GPU the reference decodes with a fixed-shape cache (`KVCache.fix_shapes`: every reserved position a key, masked
after the step's own, the position on the device) and replays its second step, captured, for every later one
(ablations/scoring/graphs.py). The fixed shapes are forced here on the CPU in float64 and checked against the
host-side specification of tests/ablations/test_beam_search_spec.py: the same hypotheses, and scores to round-off
(attention over every reserved position sums the same terms with masked zeros among them); the capture needs CUDA.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ablations.scoring import decoding
from ablations.scoring.graphs import Replay
from invariants.mutants import MUTANTS, build
from model import Transformer
from model.cache import KVCache
from tests.ablations.test_beam_search_spec import CASES, device_beam_search, host_beam_search, sources, tiny
from tests.ablations.test_decoding import TINY
from tests.ablations.test_gpu_path import attention_as_on_a_gpu
from tests.helpers import needs_cuda


@pytest.fixture
def fixed_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> list[KVCache]:
    """The GPU's fixed-shape decoding forced on the CPU; returns the caches it fixed, one per search."""
    fixed: list[KVCache] = []
    fix_shapes = KVCache.fix_shapes

    def counted(cache: KVCache, device: torch.device) -> None:
        fixed.append(cache)
        fix_shapes(cache, device)

    monkeypatch.setattr(KVCache, "fix_shapes", counted)
    monkeypatch.setattr(decoding, "at_fixed_shapes", lambda model, device: model.decodes_at_fixed_shapes)
    return fixed


def same(found: list, expected: list, dtype: torch.dtype = torch.float64) -> bool:
    """The same hypotheses, with scores equal to the model's round-off: a float64 model's to 1e-12, a float32 one's
    to 1e-5 (its logits' 1.2e-7, summed over a dozen steps and scaled by the length penalty), a bf16 one's to 1e-2
    (2^-8 a logit, where a kernel rounds differently)."""
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
    return [tokens for _, tokens in found] == [tokens for _, tokens in expected] and all(
        a == pytest.approx(b, rel=tolerance, abs=tolerance) for (a, _), (b, _) in zip(found, expected)
    )


CACHED = [name for name, (_, _, search) in CASES.items() if search.get("use_cache", True)]


@pytest.mark.parametrize("left", [False, True], ids=["right padding", "left padding"])
@pytest.mark.parametrize("case", CACHED)
def test_a_search_at_fixed_shapes_finds_the_host_searchs_hypotheses_and_scores(case, left, fixed_on_the_cpu):
    changes, lengths, search = CASES[case]
    model, (src, src_pad) = tiny(1, **changes), sources(lengths, 11, left)
    expected = host_beam_search(model, src, src_pad, **search)
    assert same(device_beam_search(model, src, src_pad, **search), expected, changes.get("dtype", torch.float64))
    assert len(fixed_on_the_cpu) == 1


@pytest.mark.parametrize("beam", [1, 4])
def test_a_search_at_fixed_shapes_with_the_memory_per_beam_finds_the_host_searchs(beam, fixed_on_the_cpu):
    model, (src, src_pad) = tiny(3), sources([7, 4, 6], seed=5)
    model.beams_share_memory = False  # the memory's keys and values reordered in place with the rest
    expected = host_beam_search(model, src, src_pad, beam=beam, extra_len=6)
    assert same(device_beam_search(model, src, src_pad, beam=beam, extra_len=6), expected)
    assert len(fixed_on_the_cpu) == 1


def captured_as_a_graph_is(replays: list[int]):
    """`ablations.scoring.graphs.captured` on the CPU, with a CUDA graph's semantics: the step traced to torch
    operators (make_fx), everything Python decided while tracing frozen into the trace, as a capture freezes it, and
    the tensors the step reads and writes (the search's state, the cache's, the position) held by reference; each
    replay runs the trace. Tracing takes the step once, as the real capture's warm-up does."""

    def captured(step, device):
        trace = make_fx(step)()

        def replay():
            replays.append(1)
            trace()

        return replay

    return captured


def test_steps_replayed_from_a_capture_of_the_second_find_the_host_searchs_hypotheses(monkeypatch, fixed_on_the_cpu):
    attention_as_on_a_gpu(monkeypatch)  # the GPU's attention: the CPU kernels are not torch operators a trace can hold
    replays: list[int] = []
    monkeypatch.setattr(decoding, "captured", captured_as_a_graph_is(replays))
    monkeypatch.setattr(decoding, "graphs_apply", lambda device: True)
    model, (src, src_pad) = tiny(2), sources([8, 5, 7], seed=6)
    expected = host_beam_search(model, src, src_pad, beam=4, extra_len=8)
    assert same(device_beam_search(model, src, src_pad, beam=4, extra_len=8), expected)
    assert len(replays) > 3


def test_a_check_mutant_decodes_at_fixed_shapes_only_where_that_finds_what_the_search_finds_without(monkeypatch):
    # A mutant that replaces decoding, the positional encoding, the causal mask or attention keeps the plain search;
    # any other decodes at fixed shapes to the same hypotheses and scores (to round-off): the path changes no model's
    # behaviour.
    src, src_pad = sources([6, 4], seed=2)
    taking = []
    for name in MUTANTS:
        torch.manual_seed(0)
        model = build(TINY.replace(max_len=32), name).double().eval()
        if not model.decodes_at_fixed_shapes:
            continue
        taking.append(name)
        plain = device_beam_search(model, src, src_pad, beam=3, extra_len=5)
        with monkeypatch.context() as m:
            m.setattr(decoding, "at_fixed_shapes", lambda model, device: True)
            assert same(device_beam_search(model, src, src_pad, beam=3, extra_len=5), plain), name
    assert 0 < len(taking) < len(MUTANTS)
    assert "causal_off_by_one" not in taking


def test_the_reference_decodes_at_fixed_shapes_and_a_subclass_with_its_own_decoding_does_not():
    class OwnDecoding(Transformer):
        def decoded(self, *args, **kwargs):
            return super().decoded(*args, **kwargs)

    assert Transformer(TINY).decodes_at_fixed_shapes and not OwnDecoding(TINY).decodes_at_fixed_shapes


def test_fixed_shapes_without_reserved_positions_are_a_clear_error():
    with pytest.raises(ValueError, match="reserve"):
        KVCache().fix_shapes(torch.device("cpu"))


@needs_cuda
@pytest.mark.filterwarnings("error:beam search")  # a failed capture warns and goes on without a graph: here, a failure
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_a_search_replaying_its_captured_step_finds_what_the_search_without_a_graph_finds(dtype, monkeypatch):
    cuda = torch.device("cuda")
    replays = []
    call = Replay.__call__
    monkeypatch.setattr(Replay, "__call__", lambda self, *args: replays.append(1) or call(self, *args))
    torch.manual_seed(0)
    model = Transformer(TINY).to(cuda, dtype).eval()
    after = (torch.randn(TINY.vocab_size, TINY.vocab_size, generator=torch.Generator().manual_seed(0)) * 3).to(
        cuda, dtype
    )
    decode = (
        model.decode
    )  # a Markov chain's logits added, as `tiny` adds them: clear choices, hypotheses of many lengths
    model.decode = lambda tgt, *args: decode(tgt, *args) + after[tgt]
    src, src_pad = (x.to(cuda) for x in sources([9, 4, 7, 7], seed=3))
    graphed = device_beam_search(model, src, src_pad, beam=4, extra_len=10)
    assert len(replays) > 3
    monkeypatch.setattr(decoding, "graphs_apply", lambda device: False)
    assert same(device_beam_search(model, src, src_pad, beam=4, extra_len=10), graphed, dtype)
