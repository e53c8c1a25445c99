"""The reference Transformer of "Attention Is All You Need" and the protocol any model under test implements."""
from model.attention import AttentionRecord, KVCache
from model.config import PRESETS, TransformerConfig, preset
from model.params import count_parameters
from model.protocol import Seq2SeqModel
from model.registry import SpecError, load_model
from model.transformer import Parts, Transformer

__all__ = [
    "AttentionRecord", "KVCache", "PRESETS", "Parts", "Seq2SeqModel", "SpecError", "Transformer",
    "TransformerConfig", "count_parameters", "load_model", "preset",
]
