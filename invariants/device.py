"""Checking a model on the user's device (`--device cuda`): the model runs there, the checks stay on the CPU.

The checks build their inputs on the CPU and compare results there, so a model on another device is wrapped in
`OnDevice`: every tensor handed to the protocol's methods goes to the device, every tensor they return (and every
captured attention record) comes back, and autograd follows both moves. Parameters stay where they are, so checks that
change weights in place or ask for gradients change and read the model's own. While a property runs on CUDA
(`checking`), TF32 is off, so that float32 matrix products keep float32's precision (TF32 rounds their inputs to a 10-bit
mantissa), and torch's deterministic algorithms are on, so that the same computation repeats bit for bit as on the CPU.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from model.attention import AttentionRecord
from model.cache import KVCache
from model.paper_params import moved
from model.protocol import Seq2SeqModel

# cuBLAS sums in a fixed order only with a workspace of its own per stream; read when its first handle is made.
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def resolve(text: str, option: str = "--device") -> torch.device:
    """The torch device `text` names, tried once in float64 (the exactness checks run in it there); a name torch does
    not know, or a device this torch cannot use, is a one-line ValueError that names the problem and the fix."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"{option} {text}: not a torch device; name one as torch does (cpu, cuda, cuda:1), or leave {option} out "
            "to check on the CPU"
        ) from None
    if device.type == "cuda":
        os.environ.setdefault(*CUBLAS_WORKSPACE)
    try:
        torch.ones(1, dtype=torch.float64, device=device).add(1).item()  # computes there and reads the result back
    except Exception as exc:  # not compiled for it, no such device, no driver, no float64, no data: torch says which
        said = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ValueError(
            f"{option} {text}: torch {torch.__version__} cannot compute in float64 there ({said}); install a torch "
            f"build for that device (and its driver), or leave {option} out to check on the CPU"
        ) from None
    return device


@contextmanager
def checking(device: torch.device) -> Iterator[None]:
    """While open on CUDA: no TF32 in matrix products and convolutions, deterministic algorithms (warning where an op
    has none); the settings before are put back. Elsewhere nothing changes."""
    if device.type != "cuda":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    deterministic, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


class OnDevice(nn.Module):
    """A model on a device behind the protocol as the checks call it: tensors in go to the device, tensors out come
    back to the CPU, the optional paper_params and paper_sublayers too. Anything else (config, unsupported, parameters,
    modules) is the model's own."""

    def __init__(self, model: Seq2SeqModel, device: torch.device) -> None:
        super().__init__()
        self.inner, self.device = model.to(device), device
        self._records: list[AttentionRecord] | None = None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")  # absent while a copy is being made
            if inner is None:
                raise
            found = getattr(inner, name)
            if name == "paper_params" and callable(found):  # optional members: the oracle's reference is on the CPU
                return lambda: moved(found(), torch.device("cpu"))
            if name == "paper_sublayers" and callable(found):
                return lambda *args: {site: x.cpu() for site, x in self._call(found, *args).items()}
            return found

    def _call(self, method, *args: object) -> object:
        out = method(*(a.to(self.device) if isinstance(a, Tensor) else a for a in args))
        for record in self._records or ():
            record.probs = record.probs.cpu()
        return out.cpu() if isinstance(out, Tensor) else out

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        return self._call(self.inner.forward, src, tgt, src_pad, tgt_pad)

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return self._call(self.inner.encode, src, src_pad)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        return self._call(self.inner.decode, tgt, memory, src_pad, tgt_pad, cache)

    def embed(self, ids: Tensor) -> Tensor:
        return self._call(self.inner.embed, ids)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return self._call(self.inner.loss, logits, target)

    def new_cache(self) -> KVCache:
        return self.inner.new_cache()

    @contextmanager
    def attention_probs(self) -> Iterator[list[AttentionRecord]]:
        with self.inner.attention_probs() as records:
            self._records = records
            try:
                yield records
            finally:
                self._records = None

    def positional_table(self, positions: int) -> Tensor:
        return self.inner.positional_table(positions).cpu()

    def positional_encoding(self, enabled: bool) -> AbstractContextManager[None]:
        return self.inner.positional_encoding(enabled)

    def embedding_weights(self) -> dict[str, Tensor]:
        return dict(self.inner.embedding_weights())  # on the device: checks compare them by identity with parameters

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        return dict(self.inner.parameter_groups())

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.inner.named_parameters(prefix, recurse, remove_duplicate)


def placed(model: Seq2SeqModel, device: torch.device) -> Seq2SeqModel:
    """The model itself on the CPU, else the model moved to the device behind `OnDevice`."""
    return model if device.type == "cpu" else OnDevice(model, device)
