"""The invariants on decoder-only language models (model/lm/protocol.py): the properties that carry over from the
paper's decoder, and those of the modern parts (rotary positions, grouped-query attention, a sliding window), run by
the same engine as the encoder-decoders' (invariants/engine.py) from a registry of their own."""
