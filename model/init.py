"""How the weights start. The paper states no initialisation, so `TransformerConfig.init` names the rule and
`init_width` carries it across widths: a model scaled down from d_model 512 to 64 can start with the stds its
full-size counterpart has (Xavier's stds and d_model^-0.5 both shrink as 1/sqrt(width))."""

from __future__ import annotations

import math
from typing import Iterable

from torch import Tensor, nn

from model.config import TransformerConfig

NORMAL_STD = 0.02  # init='normal': N(0, 0.02) for every matrix and embedding, as BERT and HF's Marian and BART


def std_factor(cfg: TransformerConfig) -> float:
    """What every initial std is multiplied by: sqrt(d_model / init_width), 1 at the model's own width."""
    return math.sqrt(cfg.d_model / cfg.init_width) if cfg.init_width else 1.0


def initialise(weights: Iterable[Tensor], embeddings: Iterable[Tensor], cfg: TransformerConfig) -> None:
    """Draw `weights` in their order by cfg.init: those among `embeddings` as token embeddings, the rest as matrices.

    'xavier': Xavier-uniform matrices, embeddings N(0, d_model^-0.5) (sqrt(d_model)-scaled ones have unit size);
    'normal': N(0, 0.02) for both. Biases are left to the caller.
    """
    embedding_ids = {id(e) for e in embeddings}
    factor = std_factor(cfg)
    for weight in weights:
        if id(weight) in embedding_ids:
            nn.init.normal_(weight, std=cfg.d_model**-0.5 * factor if cfg.init == "xavier" else NORMAL_STD)
        elif cfg.init == "xavier":
            nn.init.xavier_uniform_(weight, gain=factor)
        else:
            nn.init.normal_(weight, std=NORMAL_STD)
