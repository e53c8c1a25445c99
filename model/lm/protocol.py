"""The decoder-only protocol: what a language model must offer so that the invariants can drive it.

An adapter is a torch.nn.Module with the members below. Shapes: ids (B, T) are token ids; pad (B, T) is bool, True
at padding, which may sit on the left (as generation pads prompts) or on the right; positions (B, T) are each token's
position, counted from 0 at a row's first real token when None is given. A capability the model lacks is named in
`unsupported` with the reason, and its method raises NotImplementedError; the checks that need it are then "not
applicable". A model that pads one side only says which with `padding_side` ("left" or "right").
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol, runtime_checkable

from torch import Tensor
from torch.nn import Parameter

from model.lm.config import LMConfig

CAPABILITIES = {
    "kv_cache": "incremental decoding with new_cache() and reorder_cache() (cached decoding checks)",
    "attention_records": "recording each layer's queries, keys, values and probabilities (softmax, scale, GQA, "
    "rotary and window checks)",
    "generate": "the model's own greedy generation (generation equal to the full pass's argmax)",
}
PADDING_SIDES = ("left", "right")


@dataclass
class LMAttentionRecord:
    """One self-attention layer's view of a forward pass, as the dot product sees it.

    q (B, h, T_q, d) and k (B, h_kv, T_k, d) after positions are applied to them (rotary), before the scale; v
    (B, h_kv, T_k, d); probs (B, h, T_q, T_k). Query head i reads key/value head i // (h / h_kv) (GQA's grouping).
    With a cache, T_k counts the cached positions and the new ones.
    """

    layer: int
    q: Tensor
    k: Tensor
    v: Tensor
    probs: Tensor


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model under test. See docs/decoder-only.md for a worked adapter."""

    config: LMConfig
    unsupported: Mapping[str, str]  # capability name (a key of CAPABILITIES) -> why the model lacks it

    def forward(self, ids: Tensor, pad: Tensor, positions: Tensor | None = None, cache: object | None = None) -> Tensor:
        """Logits (B, T, vocab) for ids (B, T). With a cache (from new_cache), ids hold only the new tokens, pad covers
        the cached positions and the new ones (B, T_cached + T), positions the new ones; the cache then holds them
        all. positions may be any non-negative integers below config.max_len: the checks shift them, or set them all
        to 0 to take the positions away."""

    def new_cache(self) -> object:
        """An empty key/value cache for incremental decoding."""

    def reorder_cache(self, cache: object, index: Tensor) -> object:
        """The cache with row r holding what row index[r] held (beam search keeps other hypotheses)."""

    def generate(self, ids: Tensor, pad: Tensor, steps: int) -> Tensor:
        """`steps` new tokens (B, steps) by greedy decoding after the prompts ids (left-padded), by the model's own
        generation code; no end-of-sentence stops it."""

    def attention_records(self) -> AbstractContextManager[list[LMAttentionRecord]]:
        """While open, every self-attention layer appends an LMAttentionRecord to the yielded list."""

    def embedding_weights(self) -> Mapping[str, Tensor]:
        """The token embedding matrix and the pre-softmax linear's matrix, (vocab, d_model) each: 'input', 'output'."""

    # From torch.nn.Module, listed because the invariants call them.
    def parameters(self, recurse: bool = True) -> Iterator[Parameter]: ...

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]: ...

    def train(self, mode: bool = True) -> CausalLM: ...

    def eval(self) -> CausalLM: ...

    def to(self, *args, **kwargs) -> CausalLM: ...


def default_positions(pad: Tensor) -> Tensor:
    """What positions=None means: (B, T) the count of real tokens before each token in its row, cumsum(~pad) - 1
    (left padding sits at 0)."""
    return ((~pad).long().cumsum(1) - 1).clamp(min=0)


MEMBERS = (
    *CausalLM.__annotations__,
    *(name for name, value in vars(CausalLM).items() if callable(value) and not name.startswith("_")),
)


def missing_members(obj: object) -> list[str]:
    """The protocol members that obj lacks (empty when it satisfies the protocol)."""
    return [name for name in MEMBERS if not hasattr(obj, name)]
