"""The groups a report files its properties under: one per part of the paper's design, numbered in the order the
suite runs them, each tied to the section of the paper that states what its properties check."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    number: int
    title: str
    section: str  # where the paper says it

    @property
    def label(self) -> str:
        """'1 causal mask (section 3.2.3)': what a report's group column and the property table show."""
        return f"{self.number} {self.title} ({self.section})"


CAUSAL = Group(1, "causal mask", "section 3.2.3")
PERMUTATION = Group(2, "permutation", "sections 3.2 and 3.5")
SOFTMAX = Group(3, "softmax rows", "section 3.2.1")
POSITIONAL = Group(4, "positional encoding", "section 3.5")
PARAMETERS = Group(5, "parameters", "section 3.4 and Table 3")
BEHAVIOUR = Group(6, "expected behaviour", "sections 3.2.1, 3.4 and 5.4")
LOSS = Group(7, "label-smoothed loss", "section 5.4")
RESIDUAL = Group(8, "residual connections and LayerNorm", "section 3.1")
DROPOUT = Group(9, "residual dropout", "section 5.4")
FEED_FORWARD = Group(10, "feed-forward networks", "section 3.3")
CROSS_ATTENTION = Group(11, "cross-attention", "section 3.2.3")
ORACLE = Group(12, "the paper as an oracle", "sections 3.1 to 3.5")
GROUPS = (
    CAUSAL,
    PERMUTATION,
    SOFTMAX,
    POSITIONAL,
    PARAMETERS,
    BEHAVIOUR,
    LOSS,
    RESIDUAL,
    DROPOUT,
    FEED_FORWARD,
    CROSS_ATTENTION,
    ORACLE,
)
