"""Embeddings not scaled by sqrt(d_model) (a true departure), and a paper_sublayers that returns a list."""

from model import Transformer
from model.transformer import Parts


class Broken(Transformer):
    def paper_sublayers(self, src, tgt, src_pad, tgt_pad):
        return list(super().paper_sublayers(src, tgt, src_pad, tgt_pad).values())


def make(config):
    return Broken(config, Parts(embed_scale=lambda d_model: 1.0))
