"""The reference model as a registered adapter: `reference`, `reference:big`, `reference:base,h=4`."""
from __future__ import annotations

from model.config import TransformerConfig
from model.transformer import Transformer


def build(config: TransformerConfig) -> Transformer:
    return Transformer(config)
