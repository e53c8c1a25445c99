"""Scoring on the dev set: perplexity per BPE token without smoothing, and BLEU of beam-search output.

BLEU is sacreBLEU's corpus BLEU on detokenised text with its default 13a tokenisation (signature
recorded), plus a "tokenised" column with tokenize='intl' (mteval-v14 international tokenisation,
which splits punctuation and compound hyphens off words): closer to the paper's tokenised
multi-bleu.perl with ##AT##-##AT## compound splitting, but not identical to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sentencepiece as spm
import torch
from sacrebleu.metrics import BLEU
from tqdm.auto import tqdm

from ablations.data.batching import bucketed_batches, make_batch
from ablations.scoring.decoding import translate
from model.objective import label_smoothed_loss
from model.protocol import Seq2SeqModel


def sentence_bar(total: int, label: str | None, what: str) -> tqdm:
    """A bar of sentences done, with rate and time left, labelled with the run; none without a label."""
    return tqdm(
        total=total, desc=f"{label}: {what}", unit="sent", leave=False, dynamic_ncols=True, disable=label is None
    )


@torch.no_grad()
def perplexity(
    model: Seq2SeqModel,
    src: list[list[int]],
    tgt: list[list[int]],
    device: torch.device,
    max_tokens: int = 4000,
    autocast: torch.dtype | None = None,
    progress: str | None = None,
    dropout: bool = False,
) -> float:
    """exp(mean negative log-likelihood per target BPE token, EOS included), with no label smoothing.

    With `progress` (a label), a bar counts the sentences scored. `dropout` scores in training mode (dropout on), as
    the training loss sees the model; the dev PPL that runs report has it off."""
    model.train(dropout)
    total_nll, total_tokens = 0.0, 0
    batches = bucketed_batches([len(x) for x in src], [len(y) for y in tgt], max_tokens, seed=0, epoch=0)
    with sentence_bar(len(src), progress, "dev perplexity") as bar:
        for chosen in batches:
            batch = make_batch([src[i] for i in chosen], [tgt[i] for i in chosen]).to(device)
            with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                logits = batch.forward(model)
            mean_nll = label_smoothed_loss(
                logits if autocast is None else logits.float(), batch.labels, model.config.pad_id, 0.0
            )
            total_nll += mean_nll.item() * batch.tgt_tokens
            total_tokens += batch.tgt_tokens
            bar.update(len(chosen))
    return math.exp(total_nll / total_tokens)


@dataclass(frozen=True)
class BleuScores:
    bleu: float  # sacreBLEU 13a on detokenised text
    bleu_tokenized: float  # sacreBLEU tokenize='intl'
    signature: str
    hypotheses: list[str]


def bleu(hypotheses: list[str], references: list[str]) -> BleuScores:
    standard, tokenized = BLEU(), BLEU(tokenize="intl")
    score = standard.corpus_score(hypotheses, [references])
    score_tok = tokenized.corpus_score(hypotheses, [references])
    signature = f"{standard.get_signature()} | tokenized column: {tokenized.get_signature()}"
    return BleuScores(score.score, score_tok.score, signature, hypotheses)


def dev_bleu(
    model: Seq2SeqModel,
    sp: spm.SentencePieceProcessor,
    src: list[list[int]],
    references: list[str],
    device: torch.device,
    beam: int = 4,
    alpha: float = 0.6,
    extra_len: int = 50,
    autocast: torch.dtype | None = None,
    max_tokens: int = 2000,
    progress: str | None = None,
) -> BleuScores:
    """Beam-search the dev sources (max_tokens source tokens a batch), detokenise, score against the raw references.

    With `progress` (a label), a bar shows sentences translated, sentences/s and the time left."""
    with sentence_bar(len(src), progress, "beam search") as bar:
        hyps = translate(model, src, device, max_tokens, beam, alpha, extra_len, autocast, on_batch=bar.update)
    return bleu(sp.decode(hyps), references)
