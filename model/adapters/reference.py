"""The reference model as a registered adapter: `reference`, `reference:big`, `reference:base,h=4`."""

from __future__ import annotations

from model.config import TransformerConfig
from model.registry import register_model
from model.transformer import Transformer


@register_model("reference", "the reference Transformer; presets base, big")
def build(config: TransformerConfig) -> Transformer:
    return Transformer(config)
