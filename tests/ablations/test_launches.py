"""The launch counter sees every operator that does work, and the GPU path's choices launch fewer of them."""

import torch

from ablations.bench import launches as L
from model import TransformerConfig

SMALL = TransformerConfig(N=2, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=40, max_len=64, P_drop=0.1)


def test_the_counter_counts_operators_that_do_work_and_not_views_or_allocations():
    x = torch.randn(4, 4)
    assert L.launches(lambda: (x @ x).relu().view(16).unsqueeze(0).transpose(0, 1)) == 2
    assert L.launches(lambda: torch.empty(3)) == 0


def test_each_gpu_choice_launches_fewer_operators_in_a_training_step():
    b = L.batch(4, 6, SMALL.vocab_size)
    counts = [L.training_step_launches(SMALL, b, choices) for choices in L.CHOICES if not choices.replayed]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == len(counts) and counts[-1] > 0


def test_a_search_step_replayed_as_a_cuda_graph_launches_none_of_the_decoders_operators_but_the_replay():
    src = L.batch(2, 3, SMALL.vocab_size).src
    eager, replayed = L.CHOICES[-2:]
    assert not eager.replayed and replayed.replayed
    counts = {
        (layers, choices.replayed): L.decoding_step_launches(SMALL.replace(N=layers), src, choices)
        for layers in (1, 2)
        for choices in (eager, replayed)
    }
    assert counts[1, False] < counts[2, False]  # eagerly, each layer's operators are launched
    assert counts[1, True] == counts[2, True] < counts[1, False]  # replayed, one launch holds them all
