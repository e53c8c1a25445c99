"""Model specs: one string names the model everywhere (CLI, nox posargs, the AIAYN_MODEL variable).

  reference                 the reference model, base preset
  reference:big             a preset (base, big)
  reference:base,h=4,N=2    config overrides as key=value
  torch-nn                  torch.nn.Transformer behind the protocol
  hf-marian, hf-bart        HuggingFace MarianMT / BART, random init at the config (pip install .[hf])
  hf:PATH                   a HuggingFace model saved with save_pretrained (overrides: random init of its family)
  mutant:no_causal_mask     a deliberately broken reference model, registered by invariants.mutants when imported
  path/to/file.py:factory   your adapter: factory(config) -> model satisfying model.protocol.Seq2SeqModel
  package.module:factory    the same, importable

A layer registers what it defines with `@register_model(name, about)` on the builder; model/ registers its own
adapters and names no higher layer. invariants.mutants registers `mutant` when imported (importing `invariants`
does), so a higher layer's models exist exactly where that layer is in use: the invariants' CLI, and the ablation
runner, which imports it for `--model mutant:NAME`. This is simpler than an entry-point plugin scheme and works
from a plain checkout, with no install metadata to refresh.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping

from model.extras import EXTRA_OF
from model.config import TransformerConfig, parse_overrides
from model.table3 import preset
from model.protocol import Seq2SeqModel, missing_members

ENV_VAR = "AIAYN_MODEL"
DEFAULT_SPEC = "reference"
# What the part after ':' names, and so how a builder is called: "preset" gets the preset's config with the
# overrides; "name" gets the base config with the overrides and the name after ':'; "path" gets the name (a path)
# and the raw overrides (the saved model has its own config).
TAKES = ("preset", "name", "path")
# Modules of model/ whose import registers the shipped adapters, imported only when a name is looked up (the hf
# one imports transformers). Higher layers register their own models on import (invariants.mutants: mutant:NAME).
ADAPTERS = (
    "model.adapters.reference",
    "model.adapters.torch_nn",
    "model.adapters.hf",
    "model.adapters.hf_fsmt",
    "model.adapters.x_transformers",
    "model.adapters.joeynmt",
    "model.adapters.opennmt",
)
_FILES: dict[Path, ModuleType] = {}  # adapter files already imported, by resolved path: each is executed once
_UNAVAILABLE: dict[str, str] = {}  # adapter module -> why it could not be imported (an optional extra missing)


@dataclass(frozen=True)
class Entry:
    """A registered model: its builder, what the part after ':' names (one of TAKES) and a one-line description."""

    name: str
    build: Callable
    takes: str
    about: str


REGISTRY: dict[str, Entry] = {}


def register_model(name: str, about: str, takes: str = "preset") -> Callable[[Callable], Callable]:
    """Decorator registering a builder under a spec name; a name registered twice is a ValueError."""
    if takes not in TAKES:
        raise ValueError(f"register_model({name!r}): takes={takes!r}, expected one of {', '.join(TAKES)}")

    def register(build: Callable) -> Callable:
        if name in REGISTRY:
            raise ValueError(f"model name {name!r} is already registered by {REGISTRY[name].build.__module__}")
        REGISTRY[name] = Entry(name, build, takes, about)
        return build

    return register


def _load_adapters(until: str | None = None) -> None:
    """Import the shipped adapter modules (stopping once `until` is registered); a missing extra is noted, not raised."""
    for module in ADAPTERS:
        if until in REGISTRY:
            return
        if module in _UNAVAILABLE:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:  # one adapter's missing library never takes the others down
            extra = EXTRA_OF.get(exc.name or "") or EXTRA_OF.get(module.rsplit(".", 1)[-1])
            _UNAVAILABLE[module] = (
                f"{module} needs {exc.name}, which is not installed: pip install .[{extra}]"
                if extra
                else f"{module} could not be imported: {type(exc).__name__}: {exc}"
            )


def registered() -> dict[str, Entry]:
    """Every model name that can be given before ':', with its entry: the shipped adapters first, then those that
    other layers registered so far (in the order they registered)."""
    _load_adapters()
    shipped = {module: i for i, module in enumerate(ADAPTERS)}
    order = sorted(REGISTRY.values(), key=lambda e: shipped.get(e.build.__module__, len(ADAPTERS)))
    return {entry.name: entry for entry in order}


def lookup(name: str) -> Entry | None:
    """The entry registered under `name` (importing shipped adapters until it appears), else None."""
    if "." in name or "/" in name:  # a file or a module, never a registered name
        return None
    _load_adapters(until=name)
    return REGISTRY.get(name)


def _unknown() -> str:
    """The registered names, and the adapters that could not be loaded, for an error message."""
    missing = "".join(f"; not loaded: {why}" for why in _UNAVAILABLE.values())
    return f"registered: {', '.join(registered())}{missing}"


class SpecError(ValueError):
    """A model spec that cannot be turned into a model; the message is one line saying what to fix."""


@dataclass(frozen=True)
class ModelSpec:
    """A model to build, as typed values: a registered name, a .py file or a module; the part after ':' (a preset,
    a mutant, a path or a factory); config overrides applied on top. str() gives the text form parse_spec reads."""

    target: str
    variant: str | None = None
    overrides: Mapping[str, object] = field(default_factory=dict)

    def with_overrides(self, changes: Mapping[str, object]) -> ModelSpec:
        """The same model with more config fields set (later values win)."""
        return replace(self, overrides={**self.overrides, **changes})

    def __str__(self) -> str:
        head = f"{self.target}:{self.variant}" if self.variant else self.target
        return ",".join(filter(None, [head, format_config_overrides(self.overrides)]))


def default_spec() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_SPEC


def format_config_overrides(overrides: Mapping[str, object]) -> str:
    """Overrides as the 'key=value,...' text that parse_config_overrides reads back."""
    return ",".join(f"{key}={value}" for key, value in overrides.items())


def parse_config_overrides(text: str, where: str = "", config_class: type = TransformerConfig) -> dict[str, object]:
    """Typed fields of `config_class` from 'key=value,key=value' ('' gives {}); a bad pair is a SpecError naming
    `where`."""
    raw: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"{where or repr(text)}: override {pair!r} is not key=value")
        if key.strip() in raw:
            raise SpecError(
                f"{where or repr(text)}: {key.strip()} is given twice ({key.strip()}={raw[key.strip()]}, {pair}); give it once"
            )
        raw[key.strip()] = value.strip()
    try:
        return parse_overrides(raw, config_class)
    except ValueError as exc:
        raise SpecError(f"{where or repr(text)}: {exc}") from None


def split_spec(text: str) -> tuple[str, str, str]:
    """A spec string's parts as text: its target, the part after ':' ('' without one) and the config overrides after
    the first ','."""
    head, _, pairs = text.strip().partition(",")
    target, _, variant = head.strip().partition(":")
    return target, variant, pairs


def parse_spec(text: str) -> ModelSpec:
    """The one parser of spec strings (CLI, nox posargs, AIAYN_MODEL, config.json); a bad one is a SpecError."""
    target, variant, pairs = split_spec(text)
    if not target:
        raise SpecError(f"model spec {text!r} is empty; try 'reference' or 'path/to/file.py:factory'")
    return ModelSpec(target, variant or None, parse_config_overrides(pairs, f"model spec {text!r}"))


def file_module_name(path: Path) -> str:
    """The module name an adapter file is imported under: its stem made an identifier, and a hash of its resolved path,
    so that a model.py never takes the harness's `model` (nor a second file of the same stem the first one's)."""
    stem = re.sub(r"\W", "_", path.stem)
    return f"aiayn_adapter_{stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"


def _import_file(path: Path, spec: ModelSpec) -> ModuleType:
    """The adapter file at path, executed once per process by its path, under file_module_name(path) (registered in
    sys.modules, where dataclasses and pickle look a class's module up); sys.path is left as it is."""
    module = _FILES.get(path.resolve())
    if module is not None:
        return module
    name = file_module_name(path)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # an adapter file that calls sys.exit() on import is a bad spec too
        sys.modules.pop(name, None)
        raise SpecError(f"model spec {str(spec)!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    _FILES[path.resolve()] = module
    return module


def _import(target: str, attr: str, spec: ModelSpec) -> Callable:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise SpecError(f"model spec {str(spec)!r}: no file {path}")
        module = _import_file(path, spec)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            if exc.name in EXTRA_OF:
                raise SpecError(
                    f"model spec {str(spec)!r} needs {exc.name}, which is not installed: "
                    f"pip install .[{EXTRA_OF[exc.name]}]"
                ) from None
            raise SpecError(
                f"model spec {str(spec)!r}: {target!r} is neither a registered model ({_unknown()}) nor an importable module ({exc})"
            ) from exc
    if not hasattr(module, attr):
        raise SpecError(f"model spec {str(spec)!r}: {target} has no factory {attr!r}")
    return getattr(module, attr)


def _check_factory(factory: object, spec: ModelSpec, cfg: TransformerConfig) -> None:
    """A SpecError saying what a factory must be when it is not callable, or cannot be called with the config alone."""
    if not callable(factory):
        raise SpecError(
            f"model spec {str(spec)!r}: {spec.variant} is a {type(factory).__name__}, not a factory; "
            f"give a function or class: def {spec.variant}(cfg: TransformerConfig) -> model"
        )
    try:
        inspect.signature(factory, follow_wrapped=False).bind(cfg)
    except TypeError:
        raise SpecError(
            f"model spec {str(spec)!r}: factory {spec.variant} must take one argument, the config: "
            f"def {spec.variant}(cfg: TransformerConfig) -> model (see docs/plugging-in.md)"
        ) from None
    except ValueError:  # a builtin without a signature: the call itself says what is wrong
        pass


def load_model(spec: ModelSpec | str | None = None, config: TransformerConfig | None = None) -> Seq2SeqModel:
    """Build the model a spec names (a string is parsed first; None is $AIAYN_MODEL or reference), at `config` when
    given (every field of it: the spec's preset and overrides give way); any problem is a SpecError with a one-line
    message."""
    if not isinstance(spec, ModelSpec):
        spec = parse_spec(spec or default_spec())
    changes = dict(spec.overrides) if config is None else config.to_dict()
    entry = lookup(spec.target)
    if entry is not None:
        try:
            if entry.takes == "preset":
                model = entry.build(config or preset(spec.variant or "base").replace(**changes))
            elif entry.takes == "path":
                model = entry.build(spec.variant, changes)
            else:
                model = entry.build(config or preset("base").replace(**changes), spec.variant)
        except (ValueError, KeyError) as exc:
            raise SpecError(f"model spec {str(spec)!r}: {exc}") from None
    else:
        if spec.variant is None:
            raise SpecError(
                f"unknown model {spec.target!r}; {_unknown()}; or give path/to/file.py:factory or package.module:factory"
            )
        factory = _import(spec.target, spec.variant, spec)
        try:
            cfg = config or TransformerConfig().replace(**changes)
        except ValueError as exc:
            raise SpecError(f"model spec {str(spec)!r}: {exc}") from None
        _check_factory(factory, spec, cfg)
        try:
            model = factory(cfg)
        except (Exception, SystemExit) as exc:
            raise SpecError(
                f"model spec {str(spec)!r}: factory {spec.variant} raised {type(exc).__name__}: {exc}"
            ) from exc
    missing = missing_members(model)
    if missing:
        raise SpecError(
            f"model spec {str(spec)!r}: the object built lacks protocol members {', '.join(missing)} (see model/protocol.py)"
        )
    return model
