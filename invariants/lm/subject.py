"""The decoder-only model under test: built from a spec (or a factory), at its own config or with fields overridden.

The counterpart of invariants/subject.py for model/lm/protocol.py: the engine asks it for models by config overrides
and dtype, for the capabilities a check needs, and for the contract (one tiny forward pass) before any check runs.
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping, Union

import torch
from torch import Tensor

from invariants import precision
from invariants.guard import harness_stop
from invariants.subject import OWN_CONFIG, Overrides, Refused, seeded, tokens
from model.lm.config import LMConfig
from model.lm.protocol import PADDING_SIDES, CausalLM
from model.lm.registry import lm_config, load_lm, parse_lm_spec
from model.registry import ModelSpec, SpecError

LMFactory = Callable[[LMConfig], CausalLM]
INIT_SEED = 0
SHARPEN = 8.0  # matrices' scale in `sharpened`: attention peaks and logits spread without overflowing float32 parts


def tiny_batch(cfg: LMConfig, batch: int = 2, length: int = 4) -> tuple[Tensor, Tensor]:
    """(ids, pad): `batch` rows of non-pad tokens, the last row left-padded by one."""
    gen = torch.Generator().manual_seed(0)
    ids = tokens(cfg, (batch, length), gen)
    pad = torch.zeros(batch, length, dtype=torch.bool)
    pad[-1, 0] = batch > 1
    return ids.masked_fill(pad, cfg.pad_id), pad


def probe(model: CausalLM, capability: str) -> None:
    """Try one capability on a tiny batch; raises when the model lacks it."""
    ids, pad = tiny_batch(model.config)
    model.eval()
    with torch.no_grad():
        if capability == "kv_cache":
            cache = model.new_cache()
            model(ids[:, :2], pad[:, :2], None, cache)
            model(ids[:, 2:], pad, None, model.reorder_cache(cache, torch.tensor([1, 0])))
        elif capability == "attention_records":
            with model.attention_records() as records:
                model(ids, pad)
            if not records:
                raise NotImplementedError("attention_records() recorded nothing during a forward pass")
        elif capability == "generate":
            model.generate(ids, pad, 1)


def on_the_cpu(device: torch.device | str, option: str = "--device") -> None:
    """The decoder-only checks run on the CPU only, for now: another device is a SpecError naming the option."""
    if str(device) != "cpu":
        raise SpecError(f"{option} {device}: the decoder-only checks run on the CPU for now; drop {option}")


class LMSubject:
    """A decoder-only spec (or factory) and the models built from it, cached by (config overrides, dtype)."""

    def __init__(self, model: Union[ModelSpec, str, LMFactory], device: torch.device | str = "cpu") -> None:
        on_the_cpu(device)
        self.device = torch.device("cpu")
        self.spec = parse_lm_spec(model) if isinstance(model, str) else model if isinstance(model, ModelSpec) else None
        self.name = str(self.spec) if self.spec else getattr(model, "__qualname__", repr(model))
        self._factory = None if self.spec else model
        self.config: LMConfig = lm_config(self.spec) if self.spec else LMConfig()
        self._models: dict[tuple[tuple, torch.dtype], CausalLM] = {}
        self._refused: dict[tuple, str] = {}
        self._probed: dict[str, str | None] = {}
        self._downcasts: dict[str, precision.Downcast | None] = {}
        self._breaches: dict[str, str] | None = None
        first = self.model(OWN_CONFIG, torch.float32)  # a bad spec raises SpecError here
        config = getattr(first, "config", None)
        self.config = config if isinstance(config, LMConfig) else self.config
        declared = getattr(first, "unsupported", None)
        self.unsupported: Mapping[str, str] = dict(declared) if isinstance(declared, Mapping) else {}
        side = getattr(first, "padding_side", None)
        self.padding_sides: tuple[str, ...] = (side,) if side in PADDING_SIDES else PADDING_SIDES

    def build(self, overrides: Overrides) -> CausalLM:
        """A fresh model with these config overrides (uncached)."""
        if self.spec is not None:
            return load_lm(self.spec.with_overrides(overrides))
        try:
            cfg = LMConfig().replace(**overrides)
        except ValueError as exc:
            raise SpecError(f"model {self.name}: {exc}") from None
        return self._factory(cfg)

    def model(self, overrides: Overrides = OWN_CONFIG, dtype: torch.dtype = torch.float64) -> CausalLM:
        """The model at these overrides ({} = the spec's own), in dtype, built once with a fixed init seed."""
        key = (tuple(overrides.items()), dtype)
        if key not in self._models:
            if len(self._models) > 64:
                for k in [k for k in self._models if k[0]][:32]:
                    del self._models[k]
            with seeded(INIT_SEED):
                self._models[key] = self.refusable(overrides).to(dtype)
        return self._models[key]

    def refusable(self, overrides: Overrides) -> CausalLM:
        """A fresh model at these overrides; one the adapter will not build at a drawn config is Refused (a skipped
        case), never a verdict on the model; the spec's own config must build."""
        if not overrides:
            return self.build(overrides)
        key = tuple(overrides.items())
        if key not in self._refused:
            try:
                return self.build(overrides)
            except Exception as exc:  # noqa: BLE001 - any failure to build at a drawn config is the adapter's refusal
                said = str(exc).split(": ", 1)[-1] if isinstance(exc, SpecError) else f"{type(exc).__name__}: {exc}"
                self._refused[key] = " ".join(said.split())[:160]
        raise Refused(overrides, self._refused[key])

    def fresh(self, overrides: Overrides = OWN_CONFIG) -> CausalLM:
        """A float64 model at these overrides that a check may change: a copy of the cached one."""
        return copy.deepcopy(self.model(overrides))

    def sharpened(self, overrides: Overrides = OWN_CONFIG) -> CausalLM:
        """The float64 model at these overrides with its matrices times SHARPEN and noise on its vectors (biases, norm
        gains), built once: at a 0.02 init attention is near uniform and the top logits close, so a token's pick
        hardly depends on anything; here it does, and every parameter takes part."""
        key = (("sharpened", *overrides.items()), torch.float64)
        if key not in self._models:
            model = copy.deepcopy(self.model(overrides))
            with torch.no_grad(), seeded(INIT_SEED):
                for p in model.parameters():
                    if p.is_floating_point():
                        p.mul_(SHARPEN) if p.dim() > 1 else p.add_(0.1 * torch.randn_like(p))
            self._models[key] = model
        return self._models[key]

    def lacks(self, *names: str) -> str | None:
        """Why the model lacks one of these capabilities (declared, or found by trying it once), or None."""
        for cap in names:
            if cap not in self.unsupported and cap not in self._probed:
                self._probed[cap] = None
                try:
                    probe(self.model(OWN_CONFIG), cap)
                except BaseException as exc:  # noqa: BLE001 - whatever the try raises says the capability is missing
                    if harness_stop(exc):
                        raise
                    self._probed[cap] = f"trying it raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        reasons = [
            f"{c}: {self.unsupported.get(c) or self._probed[c]}"
            for c in names
            if self.unsupported.get(c) or self._probed.get(c)
        ]
        return "; ".join(reasons) or None

    def breach(self, prop: str, timeout: float | None = None) -> str | None:
        """'forward' when the spec's own model cannot run a tiny left-padded batch to finite (B, T, vocab) logits in
        float64 (`breaches` says how), else None: every decoder-only property needs that much."""
        if self._breaches is None:
            self._breaches = {}
            try:
                model = self.model(OWN_CONFIG)
                ids, pad = tiny_batch(self.config)
                model.eval()
                with torch.no_grad():
                    logits = model(ids, pad)
                shape = (*ids.shape, self.config.vocab_size)
                if not isinstance(logits, Tensor) or tuple(logits.shape) != shape:
                    got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
                    self._breaches["forward"] = f"returned {got}, expected logits of shape {shape}"
            except BaseException as exc:  # noqa: BLE001 - what the model raises is the breach
                if harness_stop(exc):
                    raise
                self._breaches["forward"] = f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return next(iter(self._breaches), None)

    @property
    def breaches(self) -> dict[str, str]:
        return dict(self._breaches or {})

    def downcast(self, part: str) -> precision.Downcast | None:
        """Where the spec's own model, in float64, first computes below float64 in its forward pass (None: nowhere)."""
        if part not in self._downcasts:
            self._downcasts[part] = None
            try:
                model = self.model(OWN_CONFIG)
                ids, pad = tiny_batch(self.config)
                model.eval()
                with torch.no_grad():
                    self._downcasts[part] = precision.watch(lambda: model(ids, pad))
            except Exception:  # noqa: BLE001 - a model that cannot run gets its verdict from the contract
                pass
        return self._downcasts[part]
