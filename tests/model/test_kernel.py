"""The attention kernels (model/kernels/) compute what the torch ops compute, forward and backward, and are taken only
where they apply."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import Tensor

from ablations.data.bpe import PAD
from ablations.scoring.decoding import beam_search
from model import Parts, Transformer, TransformerConfig, kernels
from model.attention import attend, attend_with_torch_ops, explicit_attention


@pytest.fixture
def built_kernel():
    """The kernels, built by the first test that needs them (not at collection: a run that selects none of these
    tests, such as the GPU check's `-m cuda`, builds nothing); a test without them is skipped."""
    if kernels.compiled() is None:
        pytest.skip("the kernel cannot be built here (see stderr)")


needs_kernel = pytest.mark.usefixtures("built_kernel")
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}  # outputs are O(1) averages of O(1) values


def qkv(B: int, h: int, T_q: int, T_k: int, d_k: int, d_v: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, T_q, d_k, generator=g, dtype=dtype)
    return (
        q,
        torch.randn(B, h, T_k, d_k, generator=g, dtype=dtype),
        torch.randn(B, h, T_k, d_v, generator=g, dtype=dtype),
    )


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d_k, d_v", [(8, 8), (64, 64), (8, 12), (20, 20)])  # the widths compiled in, and others
@pytest.mark.parametrize("T_q", [1, 4, 8])
def test_kernel_equals_explicit_attention_with_padding_and_a_row_without_keys(dtype, d_k, d_v, T_q):
    q, k, v = qkv(3, 2, T_q, 9, d_k, d_v, dtype)
    pad = torch.tensor([[False] * 9, [False] * 5 + [True] * 4, [True] * 9])  # the third row sees no key at all
    allowed = ~pad[:, None, None, :]
    expected, _ = explicit_attention(q, k, v, allowed)
    got = kernels.attention(q, k, v, allowed)
    torch.testing.assert_close(got, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert got[2].eq(0).all()


@needs_kernel
def test_kernel_reads_the_cache_views_and_head_layout_that_decoding_passes():
    q, k, v = qkv(4, 8, 1, 40, 8, 8, torch.float32)
    buffers = torch.zeros(2, 4, 8, 64, 8)  # the cache's buffers hold more positions than are filled
    buffers[0, :, :, :40], buffers[1, :, :, :40] = k, v
    k_view, v_view = buffers[0, :, :, :40], buffers[1, :, :, :40]
    q_heads = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, h, 1, d) as split from a (B, 1, h * d) projection
    causal = torch.ones(1, 40, dtype=torch.bool)  # a decoding step's causal mask: every cached key is visible
    expected, _ = explicit_attention(q, k, v, causal)
    torch.testing.assert_close(kernels.attention(q_heads, k_view, v_view, causal), expected, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_attend_takes_the_kernel_for_a_few_queries_without_gradients_or_for_narrow_heads():
    allowed = torch.ones(1, 5, dtype=torch.bool)
    few_wide = qkv(2, 2, 1, 5, 64, 64, torch.float32)
    many_wide = qkv(2, 2, kernels.MAX_QUERIES + 1, 5, 64, 64, torch.float32)
    many_narrow = qkv(2, 2, kernels.MAX_QUERIES + 1, 5, kernels.NARROW, kernels.NARROW, torch.float32)
    assert kernels.applies(*few_wide, allowed) and kernels.applies(*many_narrow, allowed)
    assert not kernels.applies(*many_wide, allowed)
    assert not kernels.applies(*(x.bfloat16() for x in few_wide), allowed)
    wide_with_grad = few_wide[0].clone().requires_grad_()
    assert not kernels.applies(wide_with_grad, *few_wide[1:], allowed)
    with torch.no_grad():
        assert kernels.applies(wide_with_grad, *few_wide[1:], allowed)
    narrow_with_grad = many_narrow[0].clone().requires_grad_()
    assert kernels.applies(narrow_with_grad, *many_narrow[1:], allowed)


def projected_heads(B: int, T: int, h: int, d: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, Tensor]:
    """A leaf (B, T, h * d), as a linear map gives it, and its heads' view (B, h, T, d), as attention receives them."""
    x = torch.randn(B, T, h * d, generator=torch.Generator().manual_seed(seed), dtype=dtype, requires_grad=True)
    return x, x.view(B, T, h, d).transpose(1, 2)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "d_k, d_v", [(8, 8), (4, 4), (2, 2), (8, 4), (3, 3)]
)  # the narrow widths compiled in, and others
@pytest.mark.parametrize("T_q, T_k, causal", [(7, 9, False), (12, 12, True), (1, 17, False), (16, 16, True)])
def test_narrow_head_kernel_gives_the_explicit_paths_outputs_and_gradients(dtype, d_k, d_v, T_q, T_k, causal):
    (xq, q), (xk, k), (xv, v) = (
        projected_heads(3, T, 2, d, dtype, seed) for seed, (T, d) in enumerate([(T_q, d_k), (T_k, d_k), (T_k, d_v)])
    )
    pad = torch.zeros(3, T_k, dtype=torch.bool)
    pad[1, T_k // 2 :] = True
    pad[2] = True  # the third row sees no key at all
    allowed = ~pad[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(T_q, T_k, dtype=torch.bool).tril()
    grad = torch.randn(3, 2, T_q, d_v, generator=torch.Generator().manual_seed(9), dtype=dtype)
    expected = explicit_attention(q, k, v, allowed)[0]
    got = kernels.attention(q, k, v, allowed)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    assert got[2].eq(0).all()
    for want, have in zip(
        torch.autograd.grad(expected, (xq, xk, xv), grad), torch.autograd.grad(got, (xq, xk, xv), grad)
    ):
        torch.testing.assert_close(have, want, atol=tol, rtol=tol)  # gradients are O(1) sums of O(1) products


@needs_kernel
def test_narrow_head_kernel_passes_torchs_numerical_gradient_check_in_float64():
    (xq, q), (xk, k), (xv, v) = (projected_heads(2, 6, 2, 8, torch.float64, seed) for seed in range(3))
    allowed = (
        torch.tensor([[True] * 6, [True] * 3 + [False] * 3])[:, None, None, :]
        & torch.ones(6, 6, dtype=torch.bool).tril()
    )

    def attention(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        heads = [x.view(2, 6, 2, 8).transpose(1, 2) for x in (a, b, c)]
        return kernels.attention(*heads, allowed)

    assert torch.autograd.gradcheck(attention, (xq, xk, xv))


@needs_kernel
def test_narrow_head_kernel_cannot_be_differentiated_twice_silently():
    (xq, q), (_, k), (_, v) = (projected_heads(2, 4, 2, 8, torch.float64, seed) for seed in range(3))
    out = kernels.attention(q, k.detach(), v.detach(), torch.ones(1, 4, dtype=torch.bool))
    (grad,) = torch.autograd.grad(out.square().sum(), xq, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


@needs_kernel
@pytest.mark.parametrize("dtype, big", [(torch.float32, 50.0), (torch.float64, 400.0)])  # past exp's range: 88, 709
def test_narrow_head_kernel_stays_finite_where_masked_keys_or_padding_score_far_above_the_visible_ones(dtype, big):
    q = torch.zeros(1, 1, 9, 8, dtype=dtype)
    q[..., 0] = 1
    k = torch.zeros(1, 1, 9, 8, dtype=dtype)
    k[0, 0, 0, 0], k[0, 0, 1, 0] = (
        -big * 8**0.5,
        big * 8**0.5,
    )  # query 0 sees only key 0, which scores -big; key 1, +big
    v = torch.randn(1, 1, 9, 8, generator=torch.Generator().manual_seed(0), dtype=dtype)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    low = torch.full((1, 1, 3, 8), -2 * big / 8**0.5, dtype=dtype)  # every score -2 big, below the zeros of the padding
    for args in [(q, k, v, causal), (q[:, :, :3], low, low, torch.ones(1, 3, dtype=torch.bool))]:
        expected = explicit_attention(*args)[0]
        got = kernels.attention(
            args[0].clone().requires_grad_(), *args[1:]
        ).detach()  # with a gradient: the narrow kernel
        assert got.isfinite().all()
        torch.testing.assert_close(got, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@needs_kernel
def test_beam_search_finds_the_same_hypotheses_with_and_without_the_kernel():
    cfg = TransformerConfig(N=2, d_model=64, d_ff=128, h=8, d_k=8, d_v=8, vocab_size=60, max_len=64)
    torch.manual_seed(0)
    reference = Transformer(cfg).eval()
    torch_ops = Transformer(cfg, Parts(attend=attend_with_torch_ops)).eval()
    torch_ops.load_state_dict(reference.state_dict())
    src = torch.randint(4, 60, (5, 9))
    src[1, 6:] = PAD
    assert beam_search(reference, src, src.eq(PAD), beam=4, extra_len=12) == beam_search(
        torch_ops, src, src.eq(PAD), beam=4, extra_len=12
    )


@pytest.fixture
def fresh_build(monkeypatch):
    """compiled() forgets its result before and after the test, so that other tests see the real build."""
    kernels.forget()
    yield monkeypatch
    kernels.forget()


def test_a_kernel_that_cannot_be_built_leaves_attention_on_torch_ops_and_says_so_in_one_line(
    fresh_build, capsys, tmp_path
):
    import torch.utils.cpp_extension

    def no_ninja(**_):
        raise RuntimeError("Ninja is required to load C++ extensions\n(traceback detail)")

    fresh_build.setattr(torch.utils.cpp_extension, "load", no_ninja)
    fresh_build.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty build folder: the build is attempted
    q, k, v = qkv(2, 2, 1, 5, 8, 8, torch.float32)
    allowed = torch.ones(1, 5, dtype=torch.bool)
    out, _ = attend(q, k, v, allowed, need_weights=False)
    torch.testing.assert_close(out, explicit_attention(q, k, v, allowed)[0])
    lines = [line for line in capsys.readouterr().err.splitlines() if "could not be built" in line]
    assert len(lines) == 1 and "Ninja is required" in lines[0] and "traceback" not in lines[0]


def test_the_kernel_is_not_built_when_switched_off(fresh_build):
    import torch.utils.cpp_extension

    fresh_build.setenv(kernels.SWITCH, "0")
    fresh_build.setattr(torch.utils.cpp_extension, "load", lambda **_: pytest.fail("built although switched off"))
    assert kernels.compiled() is None
    assert not kernels.applies(*qkv(2, 2, 1, 5, 8, 8, torch.float32), torch.ones(1, 5, dtype=torch.bool))


def test_without_building_no_build_starts_and_a_later_call_outside_the_block_still_builds(fresh_build, tmp_path):
    import torch.utils.cpp_extension

    loads = []
    fresh_build.setattr(torch.utils.cpp_extension, "load", lambda **kwargs: loads.append(kwargs) or "built")
    fresh_build.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty build folder: nothing on disk
    with kernels.without_building():
        assert kernels.compiled() is None
        assert not kernels.applies(*qkv(2, 2, 1, 5, 8, 8, torch.float32), torch.ones(1, 5, dtype=torch.bool))
    assert loads == []
    assert kernels.compiled() == "built" and len(loads) == 1


def test_without_building_a_build_already_on_disk_is_loaded(fresh_build, tmp_path):
    import torch.utils.cpp_extension

    fresh_build.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = kernels.build_folder()
    folder.mkdir(parents=True)
    (folder / f"{folder.name}.so").write_text("")  # newer than the sources: an up-to-date build
    fresh_build.setattr(torch.utils.cpp_extension, "load", lambda **kwargs: "loaded")
    with kernels.without_building():
        assert kernels.compiled() == "loaded"


def test_the_invariants_never_start_a_build(fresh_build, tmp_path):
    import torch.utils.cpp_extension

    from invariants import gradients_reach_all

    fresh_build.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    fresh_build.setattr(torch.utils.cpp_extension, "load", lambda **_: pytest.fail("the invariants started a build"))
    # float32, narrow heads, gradients and the loss: every kernel would apply here
    assert gradients_reach_all("reference,N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50").verdict == "pass"


@needs_kernel
def test_kernel_refuses_mismatched_shapes_instead_of_reading_past_them():
    q, k, v = qkv(2, 2, 1, 5, 8, 8, torch.float32)
    with pytest.raises(RuntimeError, match="v does not match k"):
        kernels.compiled().few_query_attention(q, k, v[:, :, :3], torch.ones(2, 2, 1, 5, dtype=torch.bool))


@needs_kernel
@pytest.mark.parametrize(
    "index", [[0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 5, 4], [1, 2, 3, 0, 4, 4], [2, 2, 2, 0, 0, 0], [5, 4, 3, 2, 1, 0]]
)
def test_kernel_reorder_gives_each_row_its_source_rows_filled_positions_and_leaves_the_rest(index):
    # swaps, a cycle, duplicated sources and a reversal: a source that is itself overwritten must be read before
    buffers = [torch.randn(6, 2, 10, 8) for _ in range(3)]
    before = [b.clone() for b in buffers]
    index = torch.tensor(index)
    assert kernels.reorder_rows(buffers, index, filled=7)
    for b, old in zip(buffers, before):
        assert torch.equal(b[:, :, :7], old[:, :, :7].index_select(0, index))
        assert torch.equal(b[:, :, 7:], old[:, :, 7:])  # past the filled positions nothing is written


def test_reorder_without_the_kernel_leaves_the_rows_to_torch_ops(fresh_build):
    fresh_build.setenv(kernels.SWITCH, "0")
    assert not kernels.reorder_rows([torch.zeros(2, 1, 4, 8)], torch.tensor([1, 0]), filled=2)


@needs_kernel
def test_beam_search_finds_the_same_hypotheses_with_the_kernel_switched_off(fresh_build):
    cfg = TransformerConfig(N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8, vocab_size=60, max_len=64)
    torch.manual_seed(1)
    model = Transformer(cfg).eval()
    src = torch.randint(4, 60, (6, 7))
    with_kernel = beam_search(model, src, src.eq(PAD), beam=4, extra_len=15)
    fresh_build.setenv(kernels.SWITCH, "0")
    kernels.forget()
    assert kernels.compiled() is None  # attention and the cache's reorder both through torch ops now
    assert beam_search(model, src, src.eq(PAD), beam=4, extra_len=15) == with_kernel


@needs_kernel
@pytest.mark.parametrize("where", ["query", "masked key"])
@pytest.mark.parametrize("training", [False, True])  # the few-query kernel; the narrow-head one, with gradients
def test_a_query_whose_scores_are_not_finite_gets_nan_as_on_the_explicit_path_not_a_quiet_number(where, training):
    q, k, v = qkv(2, 2, 1, 6, 8, 8, torch.float32)
    allowed = torch.tensor([True] * 4 + [False] * 2).view(1, 1, 1, 6)
    if where == "query":
        q[0, 1, 0, 3] = float("nan")
    else:
        k[0, 1, 5, 0] = float("nan")  # a padded position's key: a broken model's, not hidden by the mask
    expected, _ = explicit_attention(q, k, v, allowed)
    got = kernels.attention(q.requires_grad_(training), k, v, allowed).detach()
    assert expected[0, 1].isnan().all() and got[0, 1].isnan().all()
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=1e-5)  # the other rows are untouched


def test_keys_broadcast_over_rows_or_heads_stay_on_torch_ops():
    q, k, v = qkv(2, 2, 1, 5, 8, 8, torch.float32)
    allowed = torch.ones(1, 5, dtype=torch.bool)
    assert not kernels.applies(q, k[:1], v[:1], allowed)  # explicit_attention broadcasts them; the kernel does not
    out, _ = attend(q, k[:1], v[:1], allowed, need_weights=False)
    torch.testing.assert_close(out, explicit_attention(q, k[:1].expand_as(k), v[:1].expand_as(v), allowed)[0])


@needs_kernel
def test_a_reorder_with_a_bad_buffer_changes_no_buffer():
    good = torch.randn(4, 2, 6, 8)
    before = good.clone()
    with pytest.raises(RuntimeError, match="buffers must be"):
        kernels.reorder_rows([good, torch.randn(3, 2, 6, 8)], torch.tensor([1, 0, 2, 3]), filled=4)
    assert torch.equal(good, before)


def test_a_build_lock_left_by_a_stopped_build_is_cleared_once_no_build_could_take_so_long(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - kernels.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    kernels.wait_for_other_build(lock)  # returns at once: torch's own wait on this file would never end
    assert not lock.exists()
    kernels.wait_for_other_build(tmp_path / "no-lock")  # no build running: nothing to wait for


def test_a_failed_build_is_reported_by_the_compilers_error_line():
    message = (
        "Error building extension 'x'\n[1/2] c++ -MMD -c attention.cpp\n"
        "attention.cpp:9:3: error: 'foo' was not declared"
    )
    assert kernels.failure_line(RuntimeError(message)) == "attention.cpp:9:3: error: 'foo' was not declared"
    no_ninja = "Ninja is required to load C++ extensions"
    assert kernels.failure_line(RuntimeError(no_ninja)) == no_ninja


def test_the_build_takes_the_ninja_beside_this_python_over_another_on_the_path(monkeypatch, tmp_path):
    # Two ninja versions hash a build's commands differently: each would rebuild all that the other built.
    own = Path(sys.executable).parent / "ninja"
    if not own.is_file():
        pytest.skip("no ninja installed beside this Python")
    other = tmp_path / "ninja"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin")
    kernels.use_own_ninja()
    assert Path(shutil.which("ninja")).resolve() == own.resolve()
    path = os.environ["PATH"]
    kernels.use_own_ninja()  # already first: the PATH is left as it is
    assert os.environ["PATH"] == path
