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
    counts = [L.training_step_launches(SMALL, b, choices) for choices in L.CHOICES]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == len(counts) and counts[-1] > 0
