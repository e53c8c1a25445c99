"""The reference's GPU-only paths compute what its CPU path computes: the stacked projections (Q, K, V in one product;
cross-attention's K, V in one), in training and in decoding, standing aside for a wrapped or hooked linear; and the
causal kernel with no mask for a right-padded target in training. Forced on the CPU here, in float64, where a
difference beyond round-off is a bug, not rounding."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ablations.data.batching import make_batch, make_packed_batch
from invariants.mutants.subtle import QueryBiasAfterScale
from model import Transformer, TransformerConfig, attention, load_model, transformer
from model.batch import Batch
from tests.helpers import needs_cuda

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


def test_a_subclass_that_computes_keys_and_values_its_own_way_is_not_bypassed_by_the_stacked_product(stacked):
    torch.manual_seed(0)
    square = CONFIG.replace(d_v=CONFIG.d_k)  # its values are keys: of the keys' width
    mutant = trained_looking(load_model("mutant:values_from_key_projection", config=square)).eval()
    batch = padded_batch()
    torch.testing.assert_close(
        stacked(True, lambda: mutant(*batch)), stacked(False, lambda: mutant(*batch)), rtol=1e-12, atol=1e-12
    )


def test_a_hook_on_a_projection_still_sees_every_call_when_stacking_is_on(stacked):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).eval()
    seen: list[torch.Size] = []
    model.encoder[0].self_attn.w_k.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    stacked(True, lambda: model(*padded_batch()))
    assert seen == [torch.Size([3, 9, 4 * 8])]


@pytest.fixture
def causal_kernel(monkeypatch: pytest.MonkeyPatch):
    """The GPU's choice for right-padded targets, made on the CPU."""
    monkeypatch.setattr(transformer, "causal_kernel_applies", lambda x: True)


def right_padded_pairs() -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(2)
    src = [torch.randint(4, 50, (n,), generator=g).tolist() + [3] for n in (8, 3, 5)]
    tgt = [torch.randint(4, 50, (n,), generator=g).tolist() for n in (2, 6, 4)]
    return src, tgt


def right_padded_batch() -> Batch:
    return make_batch(*right_padded_pairs())


def training_loss(model: Transformer, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = batch.forward(model, with_labels=True)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_the_causal_kernel_on_a_right_padded_target_gives_the_masked_paths_loss_and_gradients(monkeypatch):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).train()
    batch = right_padded_batch()
    assert batch.right_padded and bool(batch.tgt_pad.any())
    masked, masked_grads = training_loss(model, batch)
    monkeypatch.setattr(transformer, "causal_kernel_applies", lambda x: True)
    seen = []
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention, seen))
    by_kernel, kernel_grads = training_loss(model, batch)
    assert seen == [True] * CONFIG.N  # each decoder layer's self-attention, with no mask
    torch.testing.assert_close(by_kernel, masked, rtol=1e-12, atol=1e-12)
    for name in masked_grads:
        torch.testing.assert_close(kernel_grads[name], masked_grads[name], rtol=1e-12, atol=1e-12, msg=name)


def spy(sdpa, seen: list[bool]):
    """scaled_dot_product_attention, noting each call's is_causal."""

    def called(*args, **kwargs):
        seen.append(kwargs.get("is_causal", False) and kwargs.get("attn_mask") is None)
        return sdpa(*args, **kwargs)

    return called


def test_a_replaced_causal_mask_is_not_bypassed_by_the_causal_kernel(causal_kernel):
    torch.manual_seed(0)
    leaky = trained_looking(load_model("mutant:causal_off_by_one", config=CONFIG)).train()
    batch, seen = right_padded_batch(), []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention, seen))
        leaked, _ = training_loss(leaky, batch)
    assert True not in seen
    reference = Transformer(CONFIG).double().train()
    reference.load_state_dict(leaky.state_dict())
    assert not torch.allclose(leaked, training_loss(reference, batch)[0], rtol=1e-6)


def test_a_batch_not_known_to_be_right_padded_keeps_the_mask(causal_kernel):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).train()
    made = right_padded_batch()
    unknown, seen = Batch(made.src, made.tgt, made.src_pad, made.tgt_pad, made.labels), []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention, seen))
        training_loss(model, unknown)
    assert not unknown.right_padded and True not in seen


@needs_cuda
def test_on_a_gpu_the_stacked_causal_path_gives_the_cpus_loss_and_gradients_in_float64():
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).train()
    batch = right_padded_batch()
    on_cpu, cpu_grads = training_loss(model, batch)
    cuda = torch.device("cuda")
    model = model.to(cuda)
    assert attention.fuses_projections(torch.zeros(1, device=cuda)) and model.causal_by_kernel(batch.src.to(cuda))
    on_gpu, gpu_grads = training_loss(model, batch.to(cuda))
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-10, atol=1e-10)
    for name in cpu_grads:
        torch.testing.assert_close(gpu_grads[name].cpu(), cpu_grads[name], rtol=1e-10, atol=1e-10, msg=name)


def test_a_packed_batch_keeps_its_pairs_mask_even_marked_right_padded(causal_kernel):
    torch.manual_seed(0)
    model = trained_looking(Transformer(CONFIG)).train()
    src, tgt = right_padded_pairs()
    packed = replace(make_packed_batch([src[:2], src[2:]], [tgt[:2], tgt[2:]]), right_padded=True)
    seen: list[bool] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention, seen))
        training_loss(model, packed)
    assert packed.packed and True not in seen


def test_the_causal_kernels_call_with_probabilities_wanted_gives_the_masked_attention_and_its_probabilities():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    masked = attention.attend(q, k, v, attention.causal_mask(5, 5, 0), need_weights=True)
    for got, want in zip(attention.attend(q, k, v, None, need_weights=True), masked):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
