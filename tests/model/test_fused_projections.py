"""The GPU's stacked projections (Q, K, V in one product; cross-attention's K, V in one) compute what the three
linears compute, in training and in decoding, and stand aside for a wrapped or hooked linear. Forced on the CPU here,
in float64, where a difference beyond round-off is a bug, not rounding."""

import pytest
import torch

from invariants.mutants.subtle import QueryBiasAfterScale
from model import Transformer, TransformerConfig, attention

CONFIG = TransformerConfig(N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=12, vocab_size=50, max_len=64, P_drop=0.0)


@pytest.fixture
def stacked(monkeypatch: pytest.MonkeyPatch):
    """Whether the projections are stacked, switched per call of `run`."""

    def run(on: bool, fn):
        with monkeypatch.context() as patch:
            patch.setattr(attention, "fuses_projections", lambda x: on)
            return fn()

    return run


def trained_looking(model: Transformer) -> Transformer:
    """The model in float64 with every parameter moved off its init (nonzero biases, LayerNorm gains not 1)."""
    model = model.double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def padded_batch() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 50, (3, 9), generator=g), torch.randint(4, 50, (3, 7), generator=g)
    src_pad, tgt_pad = torch.zeros(3, 9, dtype=torch.bool), torch.zeros(3, 7, dtype=torch.bool)
    src_pad[0, 6:], tgt_pad[1, 4:] = True, True
    return src, tgt, src_pad, tgt_pad


def loss_and_gradients(model: Transformer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    src, tgt, src_pad, tgt_pad = padded_batch()
    logits = model(src, tgt, src_pad, tgt_pad)
    (logits * torch.linspace(-1, 1, logits.numel(), dtype=logits.dtype).view_as(logits)).sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_stacked_projections_give_the_same_logits_and_gradients_as_three_linears(stacked):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).train()
    (a, grads_a), (b, grads_b) = (stacked(on, lambda: loss_and_gradients(model)) for on in (False, True))
    torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-12, atol=1e-12, msg=name)


def test_stacked_projections_decode_step_by_step_as_the_full_forward_pass(stacked):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).eval()
    src, tgt, src_pad, _ = padded_batch()
    no_pad = torch.zeros(tgt.shape, dtype=torch.bool)

    def stepwise() -> torch.Tensor:
        memory, cache = model.encode(src, src_pad), model.new_cache()
        return torch.cat([model.decode(tgt[:, t : t + 1], memory, src_pad, no_pad[:, :1], cache) for t in range(7)], 1)

    full = stacked(False, lambda: model(src, tgt, src_pad, no_pad))
    torch.testing.assert_close(stacked(True, stepwise), full, rtol=1e-12, atol=1e-12)


def test_a_wrapped_query_linear_is_not_bypassed_by_the_stacked_product(stacked):
    torch.manual_seed(0)
    mutant = trained_looking(QueryBiasAfterScale(CONFIG)).eval()  # nonzero biases: the wrapper's change shows
    torch.manual_seed(0)
    reference = Transformer(CONFIG).double().eval()
    reference.load_state_dict(mutant.state_dict())
    batch = padded_batch()
    stacked_mutant = stacked(True, lambda: mutant(*batch))
    torch.testing.assert_close(stacked_mutant, stacked(False, lambda: mutant(*batch)), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(stacked_mutant, stacked(True, lambda: reference(*batch)), rtol=1e-6, atol=1e-6)


def test_a_hook_on_a_projection_still_sees_every_call_when_stacking_is_on(stacked):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).eval()
    seen: list[torch.Size] = []
    model.encoder[0].self_attn.w_k.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    stacked(True, lambda: model(*padded_batch()))
    assert seen == [torch.Size([3, 9, 4 * 8])]
