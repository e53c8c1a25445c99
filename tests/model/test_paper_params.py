"""The paper's parameter layout (model/paper_params.py) as it travels between devices."""

import torch

from model import Transformer, TransformerConfig
from model.paper_params import export_paper_params, leaves, moved, storage

SMALL = TransformerConfig(N=1, d_model=16, h=2, d_k=8, d_v=8, d_ff=32, vocab_size=50)


def test_a_moved_copy_keeps_every_value_and_keeps_shared_weights_shared():
    params = export_paper_params(Transformer(SMALL))
    copy = moved(params, torch.device("cpu"))
    assert params.shared() and copy.shared()  # section 3.4's one matrix stays one
    assert storage(copy.pre_softmax) != storage(params.pre_softmax)  # a copy, not the model's own memory
    for (path, value), (_, copied) in zip(leaves(params), leaves(copy)):
        assert (value is None) == (copied is None), path
        if value is not None:
            assert torch.equal(value, copied) and not copied.requires_grad, path


def test_a_moved_copy_of_an_untied_model_keeps_its_three_matrices_apart():
    params = export_paper_params(Transformer(SMALL.replace(share_embeddings=False)))
    copy = moved(params, torch.device("cpu"))
    assert not copy.shared()
    assert storage(copy.source_embedding) != storage(copy.pre_softmax)
