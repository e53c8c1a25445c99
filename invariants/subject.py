"""The model under test: built from a spec (or a factory), at the spec's own config or with config fields overridden.

Checks ask for `subject.model(overrides, dtype)`; overrides are config fields set on top of the spec
({} for the spec itself, the 65M base model by default; {"N": 1, "d_model": 16, ...} for a small one),
which works for registered models and user adapters alike. Models are built with a fixed seed, so runs repeat.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Union

import torch
from torch import Tensor

from invariants import capabilities, contract, precision
from invariants.device import placed, resolve
from invariants.guard import HarnessLimit, Skipped, TimedOut, harness_stop, time_limit
from model.batch import Batch
from model.config import TransformerConfig
from model.table3 import preset
from model.protocol import PADDING_SIDES, Seq2SeqModel
from model.registry import ModelSpec, SpecError, format_config_overrides, load_model, parse_spec

Factory = Callable[[TransformerConfig], Seq2SeqModel]
Overrides = Mapping[str, object]  # config fields set on top of the spec's own config
OWN_CONFIG: Overrides = {}  # no overrides: the spec's own config (a Mapping: read, never written)
INIT_SEED = 0


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with torch's global RNG seeded (dropout masks, init), restoring the RNG afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class Refused(Skipped):
    """The adapter would not build the model at a drawn config (config overrides, what it said): a case to skip."""

    def __init__(self, overrides: Overrides, said: str) -> None:
        super().__init__(f"config {format_config_overrides(overrides)}", f"the model refuses it: {said}")


class Subject:
    """A model spec (or factory) and the models built from it, cached by (config overrides, dtype), on its device."""

    def __init__(self, model: Union[ModelSpec, str, Factory], device: torch.device | str = "cpu") -> None:
        if isinstance(model, str):
            model = parse_spec(model)
        # Where the models run (invariants/device.py); the checks stay on the CPU.
        self.device = resolve(str(device), "device")
        self.spec: ModelSpec | None = model if isinstance(model, ModelSpec) else None
        self.name = str(model) if self.spec else getattr(model, "__qualname__", repr(model))
        self._factory = None if self.spec else model
        self._models: dict[tuple[tuple, torch.dtype], Seq2SeqModel] = {}
        self._breaches: dict[str, str] | None = None  # protocol member -> how it breaks the contract (contract.py)
        first = None
        try:
            with torch.device("meta"):  # validates the spec without allocating weights
                first = self.build(OWN_CONFIG)
        except BaseException as exc:  # some adapters cannot be built on meta; a bad spec raises SpecError here
            if harness_stop(exc):
                raise
            try:
                first = self.model(OWN_CONFIG, torch.float32)
            except SpecError:
                raise
            except BaseException as exc:  # noqa: BLE001 - the contract builds it again and names what it raised
                if harness_stop(exc):
                    raise
        # What the model declares, read as the protocol has it; anything else is the contract's breach to report.
        config = getattr(first, "config", None)
        self.config: TransformerConfig = config if isinstance(config, TransformerConfig) else self._fallback_config()
        declared = getattr(first, "unsupported", None)
        self.unsupported: Mapping[str, str] = dict(declared) if isinstance(declared, Mapping) else {}
        side = getattr(first, "padding_side", None)
        # The sides a source may be padded on: the one the model declares (model.protocol.PADDING_SIDES), else both.
        self.padding_sides: tuple[str, ...] = (side,) if side in PADDING_SIDES else PADDING_SIDES
        self._probed: dict[str, str | None] = {}  # capability -> why a try of it failed (None: it went through)
        self._downcasts: dict[str, precision.Downcast | None] = {}  # part -> where it first leaves float64
        self._refused: dict[tuple, str] = {}  # drawn config overrides the adapter would not build -> what it said

    def _fallback_config(self) -> TransformerConfig:
        """The config the spec asks for, where the model does not say which it was built at."""
        try:
            return preset(self.spec.variant if self.spec and self.spec.variant in ("base", "big") else "base").replace(
                **(self.spec.overrides if self.spec else {})
            )
        except Exception:  # noqa: BLE001 - an override a registered builder reads itself
            return preset("base")

    def breach(self, prop: str, timeout: float | None = None) -> str | None:
        """The member `prop` calls that breaks the protocol's contract (`breaches` says how), or None. The contract is checked
        once, on the spec's own model in float64, within `timeout` seconds (invariants/contract.py)."""
        if self._breaches is None:
            try:
                with time_limit(timeout):
                    self._breaches = contract.check(lambda: self.model(OWN_CONFIG))
            except TimedOut:
                self._breaches = {
                    "build": f"building the model and one tiny batch through it did not end within {timeout:g} s "
                    "(a member that never returns? the limit is --timeout)"
                }
        return next((member for member in self._breaches if contract.depends(member, prop)), None)

    @property
    def breaches(self) -> dict[str, str]:
        """Every breach of the contract found so far (empty before the first property runs, or when there is none)."""
        return dict(self._breaches or {})

    def build(self, overrides: Overrides) -> Seq2SeqModel:
        """A fresh model with these config overrides (uncached, on the current default device)."""
        if self.spec is not None:
            return load_model(self.spec.with_overrides(overrides))
        try:
            cfg = preset("base").replace(**overrides)
        except ValueError as exc:
            raise SpecError(f"model {self.name}: {exc}") from None
        return self._factory(cfg)

    def model(self, overrides: Overrides = OWN_CONFIG, dtype: torch.dtype = torch.float64) -> Seq2SeqModel:
        """The model with these config overrides ({} = the spec's own), in dtype, built once with a fixed init seed."""
        key = (tuple(overrides.items()), dtype)
        if key not in self._models:
            if len(self._models) > 64:  # small configs are cheap to rebuild; keep the big ones
                for k in [k for k in self._models if k[0]][:32]:
                    del self._models[k]
            with seeded(INIT_SEED):
                self._models[key] = placed(self.refusable(overrides).to(dtype), self.device)
        return self._models[key]

    def refusable(self, overrides: Overrides) -> Seq2SeqModel:
        """A fresh model at these overrides; one the adapter refuses to build (a drawn config, not the spec's own) is
        Refused, which the engine counts as a skipped case, never as a verdict on the model."""
        if not overrides or tuple(overrides.items()) in self._refused:
            if overrides:
                raise Refused(overrides, self._refused[tuple(overrides.items())])
            return self.build(overrides)
        try:
            return self.build(overrides)
        except Exception as exc:  # noqa: BLE001 - any failure to build at a drawn config is the adapter's refusal
            said = str(exc).split(": ", 1)[-1] if isinstance(exc, SpecError) else f"{type(exc).__name__}: {exc}"
            self._refused[tuple(overrides.items())] = " ".join(said.split())[:160]
            raise Refused(overrides, self._refused[tuple(overrides.items())]) from None

    def fresh(self, overrides: Overrides = OWN_CONFIG) -> Seq2SeqModel:
        """A float64 model at these overrides that a check may change: a copy of the cached one where there is one
        (the 65M base model takes seconds to initialise, a tenth of that to copy), else built with the fixed init seed."""
        cached = self._models.get((tuple(overrides.items()), torch.float64))
        if cached is not None:
            try:
                return copy.deepcopy(cached)
            except Exception:  # an adapter holding something that cannot be copied: build it afresh
                pass
        with seeded(INIT_SEED):
            return placed(self.refusable(overrides).double(), self.device)

    def downcast(self, part: str) -> precision.Downcast | None:
        """Where the spec's own model, in float64, first computes below float64 in its `part` (precision.PARTS): its
        forward pass, or its loss; None when it stays in float64 (or when the call raises: the contract reports that)."""
        if part not in self._downcasts:
            self._downcasts[part] = None
            try:
                model = self.model(OWN_CONFIG)
                batch = capabilities.tiny_batch(model)
                training = model.training
                model.eval()
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    if part == "forward":
                        self._downcasts[part] = precision.watch(lambda: batch.forward(model))
                    else:
                        logits = torch.randn(1, 2, model.config.vocab_size, dtype=torch.float64, device=self.device)
                        self._downcasts[part] = precision.watch(lambda: model.loss(logits, batch.tgt.to(self.device)))
                model.train(training)
            except Exception:  # noqa: BLE001 - a model that cannot run gets its verdict from the contract
                pass
        return self._downcasts[part]

    def lacks(self, *names: str) -> str | None:
        """The reason the model lacks one of these capabilities, or None if it has them all: declared in `unsupported`,
        else found by trying each once on the spec's own model (invariants/capabilities.py)."""
        for cap in names:
            if cap not in self.unsupported and cap not in self._probed:
                self._probed[cap] = capabilities.missing(self.model(OWN_CONFIG), cap)
        reasons = [
            f"{cap}: {self.unsupported.get(cap) or self._probed[cap]}"
            for cap in names
            if cap in self.unsupported or self._probed[cap]
        ]
        return "; ".join(reasons) or None


def tokens(cfg: TransformerConfig, shape: tuple[int, ...], gen: torch.Generator, distinct: bool = False) -> Tensor:
    """Random non-pad token ids; distinct=True gives each row different tokens (needs shape[-1] < vocab). A vocabulary
    too small to sample from is the harness's limit: HarnessLimit, which makes the property not applicable."""
    needed = shape[-1] + 1 if distinct else 2
    if cfg.vocab_size < needed:
        raise HarnessLimit(
            f"not applicable at vocab_size={cfg.vocab_size}: this property needs at least {needed} tokens to sample "
            "from; a limit of the harness, not of the model"
        )
    if distinct:
        rows = [torch.randperm(cfg.vocab_size - 1, generator=gen)[: shape[-1]] for _ in range(shape[0])]
        ids = torch.stack(rows)
    else:
        ids = torch.randint(0, cfg.vocab_size - 1, shape, generator=gen)
    return ids + (ids >= cfg.pad_id).long()  # skip pad_id


def right_padding(batch: int, length: int, padded: bool, gen: torch.Generator) -> Tensor:
    """(batch, length) pad mask; with padded=True rows after the first get random lengths in [1, length]."""
    pad = torch.zeros(batch, length, dtype=torch.bool)
    if padded:
        for b in range(1, batch):
            pad[b, int(torch.randint(1, length + 1, (1,), generator=gen)) :] = True
    return pad


def random_batch(
    cfg: TransformerConfig,
    batch: int,
    src_len: int,
    tgt_len: int,
    padded: bool,
    seed: int,
    distinct: bool = False,
    side: str = "right",
) -> Batch:
    """A random batch whose pad positions hold pad_id; row 0 is never padded. The source is padded on `side`, the
    target on the right, as decoding produces it (a left-padded target would give real queries pad keys to their left,
    which no decoder that is fed its own output sees)."""
    gen = torch.Generator().manual_seed(seed)
    src, tgt = tokens(cfg, (batch, src_len), gen, distinct), tokens(cfg, (batch, tgt_len), gen)
    src_pad, tgt_pad = right_padding(batch, src_len, padded, gen), right_padding(batch, tgt_len, padded, gen)
    if side == "left":
        src, src_pad = src.flip(1), src_pad.flip(1)
    return Batch(src.masked_fill(src_pad, cfg.pad_id), tgt.masked_fill(tgt_pad, cfg.pad_id), src_pad, tgt_pad)


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max(1, max |expected|); NaN or Inf anywhere gives inf."""
    if not (torch.isfinite(actual).all() and torch.isfinite(expected).all()):
        return float("inf")
    if actual.numel() == 0:
        return 0.0
    scale = max(1.0, expected.abs().max().item())
    return (actual - expected).abs().max().item() / scale


def distinctness(rows: Tensor) -> float:
    """The smallest max-abs difference between two rows of (n, d), relative to the largest entry (at least 1)."""
    gaps = (rows[:, None] - rows[None]).abs().amax(-1)
    gaps.fill_diagonal_(float("inf"))
    return gaps.min().item() / max(1.0, rows.abs().max().item())
