"""Model specs: one string names the model everywhere (CLI, nox posargs, the AIAYN_MODEL variable).

  reference                 the reference model, base preset
  reference:big             a preset (base, big)
  reference:base,h=4,N=2    config overrides as key=value
  torch-nn                  torch.nn.Transformer behind the protocol
  hf-marian, hf-bart        HuggingFace MarianMT / BART, random init at the config (pip install .[hf])
  hf:PATH                   a HuggingFace model saved with save_pretrained (overrides: random init of its family)
  mutant:no_causal_mask     a deliberately broken reference model (see invariants/mutants.py)
  path/to/file.py:factory   your adapter: factory(config) -> model satisfying model.protocol.Seq2SeqModel
  package.module:factory    the same, importable
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from model.config import TransformerConfig, parse_overrides, preset
from model.protocol import Seq2SeqModel, missing_members

ENV_VAR = "AIAYN_MODEL"
DEFAULT_SPEC = "reference"

# name -> (import path of the builder, whether the part after ':' is a preset, what it is). A preset builder gets
# the preset's config with the overrides; the others get the base config with the overrides and the name after ':',
# except those in BY_PATH, which get the name (a path) and the raw overrides (the saved model has its own config).
BUILTIN: dict[str, tuple[str, bool, str]] = {
    "reference": ("model.adapters.reference:build", True, "the reference Transformer; presets base, big"),
    "torch-nn": ("model.adapters.torch_nn:build", True, "torch.nn.Transformer with the paper's embeddings and PE"),
    "hf-marian": ("model.adapters.hf:build_marian", True, "HuggingFace MarianMT, random init at the config"),
    "hf-bart": ("model.adapters.hf:build_bart", True, "HuggingFace BART, random init at the config"),
    "hf": ("model.adapters.hf:build_pretrained", False, "a HuggingFace model saved with save_pretrained: hf:PATH"),
    "mutant": ("invariants.mutants:build", False, "a reference model with one known bug: mutant:NAME"),
}
BY_PATH = {"hf"}
OPTIONAL = {"transformers": "hf"}  # a module some builtins need -> the extra that installs it
_FILES: dict[Path, object] = {}  # adapter files already imported, by resolved path: each is executed once


class SpecError(ValueError):
    """A model spec that cannot be turned into a model; the message is one line saying what to fix."""


@dataclass(frozen=True)
class Spec:
    text: str
    target: str  # a builtin name, a .py path or a module
    variant: str | None  # preset or mutant name for builtins, the factory for user adapters
    overrides: dict[str, str]


def default_spec() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_SPEC


def parse_spec(text: str) -> Spec:
    head, *pairs = [part.strip() for part in text.strip().split(",")]
    target, _, variant = head.partition(":")
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"model spec {text!r}: override {pair!r} is not key=value")
        overrides[key.strip()] = value.strip()
    if not target:
        raise SpecError(f"model spec {text!r} is empty; try 'reference' or 'path/to/file.py:factory'")
    return Spec(text, target, variant or None, overrides)


def _import(target: str, attr: str, spec: Spec) -> Callable:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise SpecError(f"model spec {spec.text!r}: no file {path}")
        module = _FILES.get(path.resolve())
        if module is None:
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            try:
                module_spec.loader.exec_module(module)
            except Exception as exc:
                raise SpecError(f"model spec {spec.text!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
            _FILES[path.resolve()] = module
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            if exc.name in OPTIONAL:
                raise SpecError(f"model spec {spec.text!r} needs {exc.name}, which is not installed: "
                                f"pip install .[{OPTIONAL[exc.name]}]") from None
            names = ", ".join(BUILTIN)
            raise SpecError(f"model spec {spec.text!r}: {target!r} is neither a registered model ({names}) nor an importable module ({exc})") from exc
    if not hasattr(module, attr):
        raise SpecError(f"model spec {spec.text!r}: {target} has no factory {attr!r}")
    return getattr(module, attr)


def load_model(text: str | None = None) -> Seq2SeqModel:
    """Build the model a spec names; any problem is a SpecError with a one-line message."""
    spec = parse_spec(text or default_spec())
    try:
        changes = parse_overrides(spec.overrides)
    except ValueError as exc:
        raise SpecError(f"model spec {spec.text!r}: {exc}") from None
    if spec.target in BUILTIN:
        path, takes_preset, _ = BUILTIN[spec.target]
        builder = _import(*path.split(":"), spec)
        try:
            if takes_preset:
                model = builder(preset(spec.variant or "base").replace(**changes))
            elif spec.target in BY_PATH:
                model = builder(spec.variant, changes)
            else:
                model = builder(preset("base").replace(**changes), spec.variant)
        except (ValueError, KeyError) as exc:
            raise SpecError(f"model spec {spec.text!r}: {exc}") from None
    else:
        if spec.variant is None:
            raise SpecError(f"unknown model {spec.target!r}; registered: {', '.join(BUILTIN)}; or give path/to/file.py:factory or package.module:factory")
        factory = _import(spec.target, spec.variant, spec)
        try:
            model = factory(TransformerConfig().replace(**changes))
        except Exception as exc:
            raise SpecError(f"model spec {spec.text!r}: factory {spec.variant} raised {type(exc).__name__}: {exc}") from exc
    missing = missing_members(model)
    if missing:
        raise SpecError(f"model spec {spec.text!r}: the object built lacks protocol members {', '.join(missing)} (see model/protocol.py)")
    return model
