"""The groups a decoder-only report files its properties under, each tied to the paper (or the paper of the modern
part) that states what its properties check."""

from __future__ import annotations

from invariants.groups import Group

CAUSAL = Group(1, "causal mask", "section 3.2.3")
PADDING = Group(2, "padding and the batch", "section 3.2.3, as users batch")
DECODING = Group(3, "cached and greedy decoding", "section 3.2.3, as generation runs it")
ATTENTION = Group(4, "attention", "sections 3.2.1 and 3.2.2; GQA, Ainslie et al. 2023; Mistral's window")
POSITIONS = Group(5, "positions", "section 3.5; RoFormer, Su et al. 2021")
OUTPUT = Group(6, "embeddings, output and precision", "sections 3.4 and 5.4")
LM_GROUPS = (CAUSAL, PADDING, DECODING, ATTENTION, POSITIONS, OUTPUT)
