"""Training in bf16 with fp32 master weights (Micikevicius et al. 2018, "Mixed Precision Training", section 3.1).

A run's precision is one of PRECISIONS. 'fp32' trains the model as it is (the CPU's). 'bf16' keeps the weights fp32
and runs the step under autocast, which casts each weight to bf16 op by op but runs LayerNorm in fp32: the residual
stream between the sub-layers (LayerNorm(x + Sublayer(x)), section 3.1) stays fp32, and each of the Q, K and V
projections casts the same fp32 input to bf16 again. 'bf16-weights' (a GPU's default) runs the forward and backward
pass on a working copy of the model whose parameters are bf16, so that every activation is bf16; the loss's softmax
stays fp32 (model/objective.py). bf16 would lose many of Adam's updates: its values near 0.05 lie 2^-12 (2.4e-4)
apart, so an update under 1.2e-4 is rounded away, and Adam's update is about the learning rate, which eq. (3) keeps
near 1e-4 early in the warm-up and late in the decay. So the optimizer steps fp32 master weights, the run's model itself: the working copy's gradients are copied into the
master's fp32 .grad, Adam steps the master, and the master is copied back, rounded, into the working copy.
Checkpoints, evaluation and resumption read the master as in an fp32 run. Buffers (the sinusoidal table) stay fp32:
PositionalEncoding casts its rows to the activations' dtype at the add.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ablations.runs.budgets import BF16_WEIGHTS
from model.params import working_copy


class MasterWeights:
    """The model's optimizer driven through its working copy: `train_step` and the checkpoints call what they call on
    an optimizer (param_groups, zero_grad, step, state_dict, load_state_dict), and every step reaches the master.

    The working copy's gradients are summed in bf16 over a step's micro-batches (and all-reduced in bf16 under
    DistributedDataParallel, which wraps the working copy), then copied into the master's fp32 .grad once a step."""

    def __init__(self, optimizer: torch.optim.Optimizer, master: nn.Module, working: nn.Module) -> None:
        self.optimizer, self.param_groups = optimizer, optimizer.param_groups
        self.master, self.working = list(master.parameters()), list(working.parameters())
        if [p.shape for p in self.master] != [p.shape for p in self.working]:
            raise ValueError("the working copy's parameters do not match the master's")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the working copy's gradients; the master's are overwritten at the next step."""
        for p in self.working:
            p.grad = None

    def step(self) -> None:
        """Copy the gradients into the master's fp32 .grad, step the master, and round it into the working copy."""
        self.grads_to_master()
        self.optimizer.step()
        self.master_to_working()

    def grads_to_master(self) -> None:
        """The working copy's gradients into the master's .grad as fp32 (None where the working copy has none, so
        that Adam skips that parameter as it would in an fp32 step); one multi-tensor copy for them all."""
        into, grads = [], []
        for master, work in zip(self.master, self.working):
            if work.grad is None:
                master.grad = None
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
            into.append(master.grad)
            grads.append(work.grad)
        if into:
            torch._foreach_copy_(into, grads)

    @torch.no_grad()
    def master_to_working(self) -> None:
        """The master's weights, rounded to the working copy's dtype, into the working copy (in place: a compiled or
        DDP-wrapped working copy keeps its parameters)."""
        torch._foreach_copy_(self.working, self.master)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The optimizer's state, and the working copy refreshed from the master (`load_checkpoint` loads the
        master's weights first)."""
        self.optimizer.load_state_dict(state)
        self.master_to_working()


def for_training(
    model: nn.Module, optimizer: torch.optim.Optimizer, precision: str
) -> tuple[nn.Module, torch.optim.Optimizer | MasterWeights]:
    """The module the step calls and the optimizer it steps: under 'bf16-weights' a bf16 working copy of the model
    (made from its weights as they are now: after a resume) and `MasterWeights`; else the model and its optimizer."""
    if precision != BF16_WEIGHTS:
        return model, optimizer
    working = working_copy(model).train()  # dropout on in every step (section 5.4); evaluation switches only the model
    return working, MasterWeights(optimizer, model, working)
