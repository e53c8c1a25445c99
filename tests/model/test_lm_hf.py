"""The HuggingFace decoder-only adapters (model/lm/hf.py): HF's own forward, padding, cache, generation and attention
records behind the protocol, each family at its registered config, in float64 unless a test says otherwise."""

import importlib
import sys

import pytest
import torch

pytest.importorskip("transformers")

from model.lm.hf import NATURAL, build_pretrained, positions_from_pad, random_model  # noqa: E402
from model.lm.hf_config import hf_config, read_lm_config  # noqa: E402
from model.lm.protocol import CausalLM, missing_members  # noqa: E402
from model.lm import registry  # noqa: E402
from model.lm.registry import load_lm, lookup_lm  # noqa: E402

FAMILIES = tuple(NATURAL)
# float64 logits of the same computation on differently padded or cached inputs: exact up to summation order.
EXACT = dict(rtol=1e-9, atol=1e-12)
# Llama, Mistral and Qwen2 take their eager softmax in float32 whatever the model's dtype (modeling_llama.py:189), so
# recorded probabilities are float32-precise in a float64 model; GPT-2's softmax runs in the model's dtype.
PROBS_SUM = {"gpt2": 1e-12, "llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6}
# float16 against float32 on logits of size ~1: a few ulps of float16 (2^-10) through two layers.
HALF = dict(rtol=0.0, atol=2e-2)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {family: random_model(family, cfg).double().eval() for family, cfg in NATURAL.items()}


def batch(rows: int, length: int, padded: dict[int, int], side: str = "left", vocab: int = 256):
    """Random ids (rows, length) with padded[r] pads in row r on `side`, and the pad mask."""
    ids = torch.randint(1, vocab, (rows, length))
    pad = torch.zeros(rows, length, dtype=torch.bool)
    for row, count in padded.items():
        pad[row, :count] = True
        if side == "right":
            pad[row] = pad[row].flip(0)
    return ids.masked_fill(pad, 0), pad


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_equals_the_hf_models_own_forward(models, family):
    model = models[family]
    ids, pad = batch(2, 10, {})
    torch.testing.assert_close(model(ids, pad), model.hf(input_ids=ids).logits, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_rows_logits_at_real_positions_equal_the_row_alone(models, family, side):
    model = models[family]
    ids, pad = batch(2, 12, {1: 5}, side)
    logits = model(ids, pad)
    alone = model(ids[1:][~pad[1:]][None], pad[1:][~pad[1:]][None])
    torch.testing.assert_close(logits[1][~pad[1]], alone[0], **EXACT)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decoding_from_a_left_padded_prompt_equals_the_full_pass_also_after_reorder(models, family):
    model = models[family]
    ids, pad = batch(3, 14, {0: 3, 2: 1})  # 14 tokens: past Mistral's window of 8
    full = model(ids, pad)
    prompt, cache = 5, model.new_cache()
    first = model(ids[:, :prompt], pad[:, :prompt], cache=cache)
    real = ~pad[:, :prompt]
    torch.testing.assert_close(first[real], full[:, :prompt][real], **EXACT)
    for t in range(prompt, ids.size(1)):
        if t == 9:
            order = torch.tensor([2, 0, 1])
            cache, ids, pad, full = model.reorder_cache(cache, order), ids[order], pad[order], full[order]
        step = model(ids[:, t : t + 1], pad[:, : t + 1], cache=cache)
        torch.testing.assert_close(step[:, 0], full[:, t], **EXACT)


def test_reorder_cache_leaves_the_cache_given_as_it_was(models):
    model = models["llama"]
    ids, pad = batch(2, 4, {})
    cache = model.new_cache()
    model(ids, pad, cache=cache)
    before = cache.layers[0].keys.clone()
    swapped = model.reorder_cache(cache, torch.tensor([1, 0]))
    assert torch.equal(cache.layers[0].keys, before) and torch.equal(swapped.layers[0].keys, before.flip(0))


@pytest.mark.parametrize("family", FAMILIES)
def test_records_have_one_per_layer_kv_heads_before_repeat_and_probability_rows_that_sum_to_one(models, family):
    model, cfg = models[family], NATURAL[family]
    ids, pad = batch(2, 9, {1: 2})
    with model.attention_records() as records:
        model(ids, pad)
    assert [r.layer for r in records] == list(range(cfg.n_layers))
    for r in records:
        assert r.q.shape == (2, cfg.n_heads, 9, cfg.d_head) and r.probs.shape == (2, cfg.n_heads, 9, 9)
        assert r.k.shape == r.v.shape == (2, cfg.kv_heads, 9, cfg.d_head)
        torch.testing.assert_close(r.probs.sum(-1), torch.ones_like(r.probs[..., 0]), rtol=0, atol=PROBS_SUM[family])
    assert model.hf.config._attn_implementation == "sdpa"  # switched back to the model's own


@pytest.mark.parametrize("spec", ["hf-mistral", "hf-qwen2,window=4"])
def test_the_window_hides_exactly_the_keys_it_should_and_a_cached_step_sees_every_key(spec):
    model = load_lm(spec).double().eval()
    window, length = model.config.window, 12
    ids, pad = batch(1, length, {})
    cache = model.new_cache()
    with model.attention_records() as records:
        model(ids[:, :-1], pad[:, :-1], cache=cache)
        model(ids[:, -1:], pad, cache=cache)
    i, j = torch.arange(length)[:, None], torch.arange(length)
    visible = (i - window < j) & (j <= i)  # LMConfig.window
    for r in records[: model.config.n_layers]:
        assert torch.equal(r.probs[0] > 0, visible[:-1, :-1].expand_as(r.probs[0]))
    for r in records[model.config.n_layers :]:
        assert r.k.size(2) == length and torch.equal(r.probs[0, :, 0] > 0, visible[-1].expand_as(r.probs[0, :, 0]))


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_the_argmax_of_the_full_pass_on_prompt_and_generated(models, family):
    model, steps = models[family], 4
    ids, pad = batch(2, 6, {0: 2})
    new = model.generate(ids, pad, steps)
    assert new.shape == (2, steps)
    logits = model(torch.cat([ids, new], 1), torch.cat([pad, torch.zeros_like(new, dtype=torch.bool)], 1))
    assert torch.equal(logits[:, ids.size(1) - 1 : -1].argmax(-1), new)


@pytest.mark.parametrize("family", FAMILIES)
def test_float16_forward_and_records_run_on_the_cpu_near_float32(family):
    torch.manual_seed(0)
    model = random_model(family, NATURAL[family]).eval()
    ids, pad = batch(2, 8, {1: 3})
    expected = model(ids, pad)
    model.half()
    with model.attention_records() as records:
        logits = model(ids, pad)
    assert records[0].probs.dtype == torch.float16
    torch.testing.assert_close(logits[~pad].float(), expected[~pad], **HALF)


@pytest.mark.parametrize(
    "family, changes, named",
    [
        ("gpt2", dict(positions="rotary"), "positions='rotary'"),
        ("gpt2", dict(n_kv_heads=2), "n_kv_heads=2"),
        ("llama", dict(norm="layernorm"), "norm='layernorm'"),
        ("llama", dict(window=4), "window=4"),
        ("llama", dict(dropout=0.1), "dropout=0.1"),
        ("mistral", dict(bias=True), "bias=True"),
        ("qwen2", dict(bias=False), "bias=False"),
    ],
)
def test_a_config_the_family_cannot_express_is_a_one_line_value_error(family, changes, named):
    with pytest.raises(ValueError) as error:
        random_model(family, NATURAL[family].replace(**changes))
    assert f"hf-{family} cannot express {named}" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_config_reads_back_from_the_hf_config_it_maps_to(family):
    for cfg in (
        NATURAL[family],
        NATURAL[family].replace(n_kv_heads=0, tie_embeddings=not NATURAL[family].tie_embeddings),
    ):
        assert read_lm_config(hf_config(family, cfg)) == cfg
    if family in ("mistral", "qwen2"):
        assert read_lm_config(hf_config(family, NATURAL[family].replace(window=3))).window == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_lm_loads_a_model_saved_by_save_pretrained_and_overrides_build_its_family_at_random(family, tmp_path):
    saved = random_model(family, NATURAL[family].replace(window=4) if family == "qwen2" else NATURAL[family])
    saved.hf.save_pretrained(tmp_path)
    loaded = load_lm(f"hf-lm:{tmp_path}").double()
    assert loaded.config == saved.config
    ids, pad = batch(2, 7, {0: 2})
    torch.testing.assert_close(loaded(ids, pad), saved.double()(ids, pad), rtol=0.0, atol=0.0)
    changed = build_pretrained(str(tmp_path), {"n_layers": 1})
    assert changed.config == saved.config.replace(n_layers=1) == read_lm_config(changed.hf.config)


@pytest.mark.parametrize("family", FAMILIES)
def test_registered_names_build_the_familys_config_with_every_protocol_member(family):
    model = load_lm(f"hf-{family}")
    assert model.config == NATURAL[family] and not missing_members(model) and isinstance(model, CausalLM)
    assert model.unsupported == {} and not hasattr(model, "padding_side")


def test_positions_count_from_each_rows_first_real_token_over_cached_and_new_columns():
    pad = torch.tensor([[True, True, False, False, False], [False, False, False, False, False]])
    assert positions_from_pad(pad, 2).tolist() == [[1, 2], [3, 4]]
    assert positions_from_pad(pad, 5)[0].tolist() == [0, 0, 0, 1, 2]


def test_without_transformers_the_adapter_is_an_import_error_that_the_registry_passes_over(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` meets where it is missing
    for name in ("model.lm.hf", "model.lm.hf_config"):
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError):
        importlib.import_module("model.lm.hf")
    monkeypatch.setattr(registry, "ADAPTERS", (("model.lm.hf", "hf-"),))
    assert lookup_lm("hf-no-such-model") is None
