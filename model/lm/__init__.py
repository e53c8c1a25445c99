"""Decoder-only language models: the paper's decoder without cross-attention, its modern options as config fields
(model/lm/config.py), the protocol a decoder-only model offers the checks (model/lm/protocol.py), and the adapters."""
