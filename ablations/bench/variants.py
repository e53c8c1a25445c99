"""What `nox -s bench` times beside the reference: each of the reference's speed choices undone (the UNDONE
variants, as the code was before the choice), and the peers, so that every before/after ratio comes from one run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ablations.bench import peers
from model import Parts, Transformer, TransformerConfig, load_model
from model.attention import attend_with_torch_ops, explicit_attention
from model.cache import KVCache
from model.objective import label_smoothed_loss_by_torch_ops


def fused_attention(q, k, v, allowed, need_weights):
    """The attention as it was: torch's fused kernel whenever no probabilities are wanted, whatever the shape."""
    if need_weights:
        return explicit_attention(q, k, v, allowed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), None


def torch_cross_entropy(logits, target, pad_id, eps):
    """The loss as it was: F.cross_entropy with label_smoothing (the same value, more passes over the logits)."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=eps)


@dataclass(frozen=True)
class Variant:
    """One system to train: how to build it, which form of Adam (fused, foreach or loop), which thread count."""

    name: str
    build: Callable[[TransformerConfig], torch.nn.Module | None]
    adam: str = "fused"
    default_threads: bool = False  # torch's default (every core) instead of choose_threads
    sizes: tuple[str, ...] = ("base", "scaled")


UNDONE = "before: "


VARIANTS = [
    Variant("reference", Transformer),
    Variant(
        UNDONE + "attention through torch ops, no narrow-head kernel",
        lambda c: Transformer(c, Parts(attend=attend_with_torch_ops)),
        sizes=("scaled",),
    ),
    Variant(
        UNDONE + "fused attention kernel everywhere",
        lambda c: Transformer(c, Parts(attend=fused_attention)),
        sizes=("scaled",),
    ),
    Variant(
        UNDONE + "loss by torch ops, no loss kernel",
        lambda c: Transformer(c, Parts(loss=label_smoothed_loss_by_torch_ops)),
        sizes=("scaled",),
    ),
    Variant(
        UNDONE + "torch cross_entropy loss",
        lambda c: Transformer(c, Parts(loss=torch_cross_entropy)),
        sizes=("scaled",),
    ),
    Variant(UNDONE + "Adam per-parameter loop", Transformer, adam="loop", sizes=("scaled",)),
    Variant(UNDONE + "Adam multi-tensor (foreach), not fused", Transformer, adam="foreach", sizes=("scaled",)),
    Variant(UNDONE + "torch's default thread count", Transformer, default_threads=True),
    Variant(
        UNDONE + "all of the above",
        lambda c: Transformer(c, Parts(attend=fused_attention, loss=torch_cross_entropy)),
        adam="loop",
        default_threads=True,
    ),
    Variant("torch.nn.Transformer adapter", lambda c: load_model("torch-nn", config=c)),
    Variant("HF MarianMT, same dims", peers.hf_marian),
]


class FullReorderCache(KVCache):
    """The cache as it was: at each step every cached self-attention row is gathered into a second set of buffers,
    which then swap with the first, whether its hypothesis moved or not."""

    def __init__(self, beams: int = 1) -> None:
        super().__init__(beams)
        self._spare: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def reorder(self, index: torch.Tensor) -> None:
        for name, (k, v) in list(self.kv.items()):
            if name in self._buffers:
                buffers, spare = self._buffers[name], self._spare.get(name)
                if spare is None or spare[0].shape != buffers[0].shape:  # append grew the buffers
                    spare = tuple(torch.empty_like(b) for b in buffers)
                for old, new in zip((k, v), spare):
                    torch.index_select(old, 0, index, out=new[:, :, : k.size(2)])
                self._spare[name], self._buffers[name] = buffers, spare
                self.kv[name] = tuple(b[:, :, : k.size(2)] for b in spare)


class TorchOpsReorderCache(KVCache):
    """The cache whose moved rows are rewritten by torch ops (gathered, then written back), as before the kernel."""

    rewrite_rows = KVCache.rewrite_rows_with_torch_ops


class _StridedCross(dict):
    """Cache entries that keep cross-attention's keys and values in the projection's layout, (B, T, h*d) seen as
    (B, h, T, d) with strides, as they were stored before they were made contiguous."""

    def __setitem__(self, name: str, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        if name.startswith("cross"):
            kv = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in kv)
        super().__setitem__(name, kv)


class StridedCrossCache(KVCache):
    """The cache as it was for cross-attention: the heads' strided view of the memory's keys and values, which every
    decoding step's two matmuls copy again. For beam search with the memory shared by each sentence's beams (as the
    bench runs it): there `reorder` leaves the cross-attention entries alone."""

    def __init__(self, beams: int = 1) -> None:
        super().__init__(beams)
        self.kv = _StridedCross()
