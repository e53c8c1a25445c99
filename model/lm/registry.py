"""Decoder-only model specs, in the same text form as the encoder-decoders' (model/registry.py):

  lm-reference              the reference decoder-only model at its "small" preset (the paper's decoder, small)
  lm-reference:modern       a preset (model/lm/config.py PRESETS: small, modern, gpt2-small)
  lm-reference:modern,window=4   config overrides as key=value (LMConfig's fields)
  hf-gpt2, hf-llama, hf-mistral, hf-qwen2   HuggingFace models, random init at small sizes (pip install .[hf])
  hf-lm:PATH                a HuggingFace causal LM saved with save_pretrained
  lm-mutant:NAME            a deliberately broken reference model, registered by invariants.lm.mutants
  path/to/file.py:factory   your adapter, when factory's argument is annotated LMConfig: factory(cfg) -> CausalLM

Each registered name has its own config (a family's natural one), which overrides change field by field.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable

from model.config import field_names as encoder_decoder_fields
from model.lm.config import LMConfig, field_names
from model.lm.protocol import CausalLM, missing_members
from model.registry import ModelSpec, SpecError, _import, parse_config_overrides, split_spec

TAKES = ("preset", "name", "path")
# The shipped adapters and the names they register start with, imported only when such a name is looked up (the hf
# one imports transformers, which a check of another model must not pay for, nor need installed).
ADAPTERS = (("model.lm.reference", "lm-"), ("model.lm.hf", "hf-"))


@dataclass(frozen=True)
class LMEntry:
    """A registered decoder-only model: its builder, what the part after ':' names, its description, and its own
    config for a variant (the preset's, a mutant's, a family's)."""

    name: str
    build: Callable
    takes: str
    about: str
    config: Callable[[str | None], LMConfig] = field(default=lambda variant: LMConfig())


LM_REGISTRY: dict[str, LMEntry] = {}


def register_lm(
    name: str, about: str, takes: str = "preset", config: Callable[[str | None], LMConfig] = lambda v: LMConfig()
) -> Callable[[Callable], Callable]:
    """Decorator registering a decoder-only builder under a spec name; a name registered twice is a ValueError."""
    if takes not in TAKES:
        raise ValueError(f"register_lm({name!r}): takes={takes!r}, expected one of {', '.join(TAKES)}")

    def register(build: Callable) -> Callable:
        if name in LM_REGISTRY:
            raise ValueError(f"model name {name!r} is already registered by {LM_REGISTRY[name].build.__module__}")
        LM_REGISTRY[name] = LMEntry(name, build, takes, about, config)
        return build

    return register


def lookup_lm(name: str) -> LMEntry | None:
    """The decoder-only entry registered under `name` (importing the shipped adapters first), else None."""
    if "." in name or "/" in name:
        return None
    for module, prefix in ADAPTERS:
        if name in LM_REGISTRY or not name.startswith(prefix):
            continue
        try:
            importlib.import_module(module)
        except ImportError:  # transformers missing: hf-* names stay unknown, and the error names the extra
            pass
    return LM_REGISTRY.get(name)


def parse_lm_spec(text: str) -> ModelSpec:
    """A decoder-only spec string as typed values (overrides typed by LMConfig's fields); a bad one is a SpecError."""
    target, variant, pairs = split_spec(text)
    return ModelSpec(target, variant or None, parse_config_overrides(pairs, f"model spec {text!r}", LMConfig))


def takes_lm_config(factory: object) -> bool:
    """Whether a user's factory declares its argument an LMConfig (by annotation, as docs/decoder-only.md asks)."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return False
    annotation = parameters[0].annotation if parameters else None
    return annotation is LMConfig or (isinstance(annotation, str) and annotation.split(".")[-1] == "LMConfig")


def is_decoder_only(text: str) -> bool:
    """Whether a spec names a decoder-only model: a registered decoder-only name, or a factory taking an LMConfig."""
    target, variant, _ = split_spec(text)
    if lookup_lm(target.strip()) is not None:
        return True
    if not variant or ("." not in target and "/" not in target):
        return False
    try:
        return takes_lm_config(_import(target.strip(), variant.strip(), ModelSpec(target, variant)))
    except SpecError:
        return False


def annotation_hint(text: str) -> str:
    """What to add to a spec's error when it sets LMConfig fields that the encoder-decoders' config lacks (a decoder-only
    factory without its annotation); '' otherwise."""
    keys = {pair.partition("=")[0].strip() for pair in text.partition(",")[2].split(",")}
    fields = sorted(keys & set(field_names()) - set(encoder_decoder_fields()))
    if not fields:
        return ""
    return (
        f" ({', '.join(fields)}: decoder-only config fields; a decoder-only factory annotates its argument: "
        "def build(cfg: LMConfig), docs/decoder-only.md)"
    )


def lm_config(spec: ModelSpec) -> LMConfig:
    """The config a spec builds at: its entry's own for the variant, with the overrides; a user factory's starts at
    LMConfig's defaults."""
    entry = lookup_lm(spec.target)
    base = entry.config(spec.variant) if entry is not None and entry.takes != "path" else LMConfig()
    try:
        return base.replace(**spec.overrides)
    except ValueError as exc:
        raise SpecError(f"model spec {str(spec)!r}: {exc}") from None


def load_lm(spec: ModelSpec | str, config: LMConfig | None = None) -> CausalLM:
    """Build the decoder-only model a spec names, at `config` when given; any problem is a SpecError in one line."""
    if not isinstance(spec, ModelSpec):
        spec = parse_lm_spec(spec)
    entry = lookup_lm(spec.target)
    try:
        if entry is not None and entry.takes == "path":
            model = entry.build(spec.variant, dict(spec.overrides) if config is None else config.to_dict())
        elif entry is not None:
            cfg = config or lm_config(spec)
            model = entry.build(cfg) if entry.takes == "preset" else entry.build(cfg, spec.variant)
        else:
            if spec.variant is None:
                known = ", ".join(LM_REGISTRY)
                raise SpecError(f"unknown decoder-only model {spec.target!r}; registered: {known}")
            factory = _import(spec.target, spec.variant, spec)
            model = factory(config or lm_config(spec))
    except SpecError:
        raise
    except (Exception, SystemExit) as exc:
        raise SpecError(f"model spec {str(spec)!r}: building it raised {type(exc).__name__}: {exc}") from exc
    missing = missing_members(model)
    if missing:
        raise SpecError(
            f"model spec {str(spec)!r}: the object built lacks protocol members {', '.join(missing)} "
            "(see model/lm/protocol.py)"
        )
    return model
