"""The reference Transformer of "Attention Is All You Need" and the protocol any model under test implements."""

from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
from model.table3 import PRESETS, preset
from model.params import count_parameters
from model.protocol import Seq2SeqModel
from model.registry import ModelSpec, SpecError, load_model, parse_spec
from model.transformer import Parts, Transformer

__all__ = [
    "AttentionRecord",
    "KVCache",
    "ModelSpec",
    "PRESETS",
    "Parts",
    "Seq2SeqModel",
    "SpecError",
    "Transformer",
    "TransformerConfig",
    "count_parameters",
    "load_model",
    "parse_spec",
    "preset",
]
