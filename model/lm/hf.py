"""HuggingFace decoder-only models behind the decoder-only protocol: `hf-gpt2`, `hf-llama`, `hf-mistral`, `hf-qwen2`
(random init at a small config of the family's own kind) and `hf-lm:PATH` (needs `pip install .[hf]`).

Every capability is HF's own: forward is the model's forward, the cache HF's DynamicCache, generation its
`generate`, and attention records come from the family's eager attention, run through transformers'
AttentionInterface while the records are open (the forward path is SDPA, which returns no probabilities). How each
family's fields map onto LMConfig, and where they differ, is in model/lm/hf_config.py.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download at run time
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402  (an ImportError leaves the other decoder-only adapters usable: model.lm.registry)
from torch import Tensor, nn  # noqa: E402
from transformers import AttentionInterface, DynamicCache, GenerationConfig  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402

from model.layers import temporarily  # noqa: E402
from model.lm.config import LMConfig, lm_preset  # noqa: E402
from model.lm.hf_config import FAMILIES, hf_config, read_lm_config  # noqa: E402
from model.lm.protocol import LMAttentionRecord, default_positions  # noqa: E402
from model.lm.registry import register_lm  # noqa: E402

transformers.logging.set_verbosity_error()  # no notes on padding side, generation flags or tied weights

RECORDING = "aiayn-records"  # the attention implementation a model switches to while its records are open
_OPEN: dict[int, list[LMAttentionRecord]] = {}  # id of a recording model's HF config -> the list it appends to


def _recorded_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, **kwargs):
    """The eager attention of the module's own family (its modeling file's eager_attention_forward), recording its
    inputs (keys and values before repeat_kv: the kv heads) and the probabilities it returns."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    output, probs = eager(module, query, key, value, mask, **kwargs)
    _OPEN[id(module.config)].append(LMAttentionRecord(module.layer_idx, query, key, value, probs))
    return output, probs


def _recording_mask(dtype: torch.dtype = torch.float32, **kwargs) -> Tensor:
    """HF's additive eager mask, at float32's minimum in a float64 model: float64's minimum becomes -inf in the float32
    softmax of Llama's eager attention (modeling_llama.py:189), and a pad query, all of whose keys are masked, NaN."""
    return eager_mask(dtype=torch.float32 if dtype == torch.float64 else dtype, **kwargs)


AttentionInterface.register(RECORDING, _recorded_attention)
AttentionMaskInterface.register(RECORDING, _recording_mask)


def positions_from_pad(pad: Tensor, length: int) -> Tensor:
    """Each token's position counted from its row's first real token, over the whole pad (cached and new), for the
    last `length` columns: HF's generate does the same (generation/utils.py:604) but puts pads at 1, here at 0."""
    return default_positions(pad)[:, pad.size(1) - length :]


class HFCausalLM(nn.Module):
    """A HuggingFace causal LM (GPT2LMHeadModel, LlamaForCausalLM, ...) with the decoder-only protocol's methods."""

    def __init__(self, hf: nn.Module, cfg: LMConfig) -> None:
        super().__init__()
        self.hf, self.config = hf, cfg
        self.unsupported: dict[str, str] = {}

    def forward(self, ids: Tensor, pad: Tensor, positions: Tensor | None = None, cache: object | None = None) -> Tensor:
        out = self.hf(
            input_ids=ids,
            attention_mask=(~pad).long(),
            position_ids=positions_from_pad(pad, ids.size(1)) if positions is None else positions,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.logits

    def new_cache(self) -> DynamicCache:
        """A DynamicCache without the config, so that it keeps every key: with the config, a sliding-window layer
        drops keys past the window (cache_utils.py:207) and records would see fewer than the protocol's T_k."""
        return DynamicCache()

    def reorder_cache(self, cache: DynamicCache, index: Tensor) -> DynamicCache:
        """A new cache of the rows HF's reorder_cache would pick (it works in place); the cache given is left as it
        was."""
        index = index.to(self.hf.device)
        return DynamicCache([(layer.keys[index], layer.values[index]) for layer in cache.layers])

    def generate(self, ids: Tensor, pad: Tensor, steps: int) -> Tensor:
        """HF's greedy generate under a config of its own, so that a saved model's defaults (sampling, repetition
        penalties, its EOS) do not apply: no EOS at all, so nothing stops it before `steps` tokens."""
        greedy = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=steps,  # with no EOS, nothing else stops it (min_new_tokens would only hold an EOS back)
            eos_token_id=None,
            pad_token_id=self.config.pad_id,
        )
        with temporarily(self.hf, "generation_config", greedy), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generation-flag and padding-side notes
            out = self.hf.generate(input_ids=ids, attention_mask=(~pad).long())
        return out[:, ids.size(1) :]

    @contextmanager
    def attention_records(self) -> Iterator[list[LMAttentionRecord]]:
        """Switch the model to the recording attention while open, back to its own implementation after."""
        config = self.hf.config
        records = _OPEN[id(config)] = []
        try:
            with temporarily(config, "_attn_implementation", RECORDING):
                yield records
        finally:
            del _OPEN[id(config)]

    def embedding_weights(self) -> dict[str, Tensor]:
        return {"input": self.hf.get_input_embeddings().weight, "output": self.hf.get_output_embeddings().weight}


def random_model(family: str, cfg: LMConfig, base: dict | None = None) -> HFCausalLM:
    """A model of the family at cfg, initialised at random by HF's own rule (over a saved config's other fields)."""
    return HFCausalLM(FAMILIES[family][1](hf_config(family, cfg, base)), cfg)


# Each family's own kind of model at a small size (LMConfig's): GPT-2's learned positions, pre-LN with LayerNorm,
# GELU and tied embeddings; Llama's rotary, RMSNorm, SwiGLU, GQA and untied embeddings ("modern"); Mistral's sliding
# window, short enough to matter in short checks; Qwen2's q/k/v biases (real Qwen2 configs slide no window).
NATURAL = {
    "gpt2": LMConfig(positions="learned", norm_position="pre", ffn="gelu", scale_embeddings=False),
    "llama": lm_preset("modern"),
    "mistral": lm_preset("modern").replace(window=8, max_len=64),
    "qwen2": lm_preset("modern").replace(bias=True),
}


@register_lm("hf-gpt2", "HuggingFace GPT2LMHeadModel, random init", config=lambda variant: NATURAL["gpt2"])
def build_gpt2(config: LMConfig) -> HFCausalLM:
    return random_model("gpt2", config)


@register_lm("hf-llama", "HuggingFace LlamaForCausalLM, random init", config=lambda variant: NATURAL["llama"])
def build_llama(config: LMConfig) -> HFCausalLM:
    return random_model("llama", config)


@register_lm("hf-mistral", "HuggingFace MistralForCausalLM, random init", config=lambda variant: NATURAL["mistral"])
def build_mistral(config: LMConfig) -> HFCausalLM:
    return random_model("mistral", config)


@register_lm("hf-qwen2", "HuggingFace Qwen2ForCausalLM, random init", config=lambda variant: NATURAL["qwen2"])
def build_qwen2(config: LMConfig) -> HFCausalLM:
    return random_model("qwen2", config)


@register_lm("hf-lm", "a HuggingFace causal LM saved with save_pretrained: hf-lm:PATH", takes="path")
def build_pretrained(path: str | None, changes: dict[str, object]) -> HFCausalLM:
    """hf-lm:PATH: the saved model, or (when changes move its config) a random model of its family at the new config
    with the saved config's other fields."""
    if not path:
        raise ValueError("hf-lm needs a folder: hf-lm:PATH (written by save_pretrained) or a hub name already cached")
    try:
        saved = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        raise ValueError(
            f"{path} is neither a folder written by save_pretrained nor a hub name in the local cache "
            "(nothing is downloaded at run time: download it once, or save_pretrained to a folder)"
        ) from None
    cfg = read_lm_config(saved)
    wanted = cfg.replace(**changes)
    if wanted != cfg:
        return random_model(saved.model_type, wanted, saved.to_dict())
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, attn_implementation="sdpa")
    return HFCausalLM(hf, cfg)
