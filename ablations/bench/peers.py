"""Other implementations that the benchmark runs beside the reference, at the same dims and on the same tokens.

HF MarianMT (pip install .[bench]) trains through its protocol adapter and decodes with `generate`; CTranslate2
decodes the same random-init Marian model, converted locally (nothing is downloaded). A peer whose library is
missing is None, and the benchmark prints one line for it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from ablations.data.bpe import EOS, PAD
from model import TransformerConfig, load_model

MISSING = "skipped: pip install .[bench]"
Decoder = Callable[[Tensor, int, int], None]  # (src ids (B, S) without padding, beam, output length) -> None


def hf_marian(cfg: TransformerConfig) -> torch.nn.Module | None:
    """HF MarianMT at cfg behind the protocol (random init), or None without transformers."""
    try:
        return load_model("hf-marian", config=cfg)
    except ValueError as exc:  # the registry's "pip install .[hf]" for a missing library
        if "pip install" in str(exc):
            return None
        raise


def hf_generate(model: torch.nn.Module) -> Decoder:
    """Beam search with HF `generate`, forced to exactly `length` new tokens."""

    def run(src: Tensor, beam: int, length: int) -> None:
        model.hf.generate(
            input_ids=src,
            attention_mask=src.ne(PAD).long(),
            num_beams=beam,
            do_sample=False,
            max_new_tokens=length,
            min_new_tokens=length,
            length_penalty=0.6,
        )

    return run


def ctranslate2_decoder(model: torch.nn.Module, threads: int) -> Decoder | None:
    """CTranslate2 (fp32) on the Marian model converted in a temporary folder; None without ctranslate2."""
    try:
        import ctranslate2
        from ctranslate2.converters.transformers import TransformersConverter
    except ImportError:
        return None
    vocab = [f"t{i}" for i in range(model.config.vocab_size)]
    vocab[EOS], vocab[PAD], vocab[-1] = "</s>", "<unk>", "<pad>"  # the converter drops Marian's trailing <pad> row

    class Tokens:  # the converter reads the vocabulary and the special tokens from a tokenizer
        eos_token, unk_token = "</s>", "<unk>"

        def get_vocab(self) -> dict[str, int]:
            return {token: i for i, token in enumerate(vocab)}

    class InMemory(TransformersConverter):
        def load_model(self, model_class, path, **kwargs):
            return model.hf

        def load_tokenizer(self, tokenizer_class, path, **kwargs):
            return Tokens()

    folder = Path(tempfile.mkdtemp(prefix="ct2-"))
    model.hf.config.save_pretrained(folder / "hf")
    InMemory(str(folder / "hf")).convert(str(folder / "ct2"), quantization="float32", force=True)
    translator = ctranslate2.Translator(
        str(folder / "ct2"), device="cpu", compute_type="float32", intra_threads=threads, inter_threads=1
    )

    def run(src: Tensor, beam: int, length: int) -> None:
        batch = [[vocab[i] for i in row if i != PAD] for row in src.tolist()]
        translator.translate_batch(
            batch,
            beam_size=beam,
            max_decoding_length=length,
            min_decoding_length=length,
            length_penalty=0.6,
            max_batch_size=0,
        )

    return run
