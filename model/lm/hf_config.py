"""LMConfig to and from the configs of HuggingFace's GPT-2, Llama, Mistral and Qwen2, field by field (needs
`pip install .[hf]`). What a family cannot express is refused in one line that names the field and what it supports.

Where a family's meaning differs from LMConfig's (paths are under transformers/, lines as of 4.57):
  window: HF's sliding window hides key j from query i unless i - sliding_window < j <= i, over sequence indices
    (masking_utils.py:88 `kv_idx > q_idx - sliding_window`, :78 `kv_idx <= q_idx`): LMConfig.window exactly, so
    sliding_window = window. Qwen2 slides only on layers from max_window_layers on (configuration_qwen2.py:204),
    so a window is every layer's (layer_types all "sliding_attention").
  bias: Llama has attention_bias and mlp_bias (both set from bias); Mistral has no biases (modeling_mistral.py:135,
    :41); Qwen2 has biases on q, k and v only (modeling_qwen2.py:134-137, none on o_proj or the MLP at :40): bias=True
    stands for Qwen2's own q/k/v biases, and bias=False is refused.
  ffn: GPT-2's "gelu" is its own tanh approximation, gelu_new (configuration_gpt2.py:146).
  dropout: GPT-2's resid_pdrop and embd_pdrop (the paper's section 5.4 sites), attn_pdrop 0; a saved GPT-2 keeps its
    own attn_pdrop. Llama, Mistral and Qwen2 have no residual dropout, only attention_dropout: dropout must be 0.
"""

from __future__ import annotations

from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from model.lm.config import LMConfig

FAMILIES = {
    "gpt2": (GPT2Config, GPT2LMHeadModel),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}
_ROTARY = dict(
    positions=("rotary",),
    rotary_layout=("half",),  # rotate_half, modeling_llama.py:109
    norm=("rmsnorm",),
    norm_position=("pre",),
    ffn=("swiglu",),
    scale_embeddings=(False,),
    dropout=(0.0,),
)
# The values each family can take where it cannot take every value (n_kv_heads as 0 when it equals n_heads).
SUPPORTED: dict[str, dict[str, tuple]] = {
    "gpt2": dict(
        positions=("learned",),
        norm=("layernorm",),
        norm_position=("pre",),
        ffn=("gelu", "relu"),
        n_kv_heads=(0,),
        window=(0,),
        scale_embeddings=(False,),
        bias=(True,),
    ),
    "llama": {**_ROTARY, "window": (0,)},
    "mistral": {**_ROTARY, "bias": (False,)},
    "qwen2": {**_ROTARY, "bias": (True,)},
}
GPT2_FFN = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu", "relu": "relu"}  # activation -> ffn
GPT2_ACTIVATION = {"gelu": "gelu_new", "relu": "relu"}  # ffn -> GPT-2's activation_function for a new model


def refuse_inexpressible(family: str, cfg: LMConfig) -> None:
    """Raise a one-line ValueError when `family` cannot build a model at cfg."""
    values = {**cfg.to_dict(), "n_kv_heads": 0 if cfg.kv_heads == cfg.n_heads else cfg.n_kv_heads}
    for name, allowed in SUPPORTED[family].items():
        if values[name] not in allowed:
            choices = " or ".join(f"{name}={value!r}" for value in allowed)
            raise ValueError(f"hf-{family} cannot express {name}={values[name]!r}: it supports {choices} only")


def hf_config(family: str, cfg: LMConfig, base: dict | None = None) -> PretrainedConfig:
    """The HF config of `family` at cfg, over a saved config's other fields (norm epsilons, token ids) when given."""
    refuse_inexpressible(family, cfg)
    base = base or {}
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings, pad_token_id=cfg.pad_id)
    if family == "gpt2":
        kept = base.get("activation_function")
        fields = dict(
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_inner=cfg.d_ff,
            n_positions=cfg.max_len,
            activation_function=kept if GPT2_FFN.get(kept) == cfg.ffn else GPT2_ACTIVATION[cfg.ffn],
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=base.get("attn_pdrop", 0.0),
        )
    else:
        fields = dict(
            hidden_size=cfg.d_model,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.kv_heads,
            head_dim=cfg.d_head,
            intermediate_size=cfg.d_ff,
            max_position_embeddings=cfg.max_len,
            rope_theta=cfg.rotary_base,
            rope_scaling=None,
            hidden_act="silu",  # SwiGLU: down(silu(gate(x)) * up(x)), modeling_llama.py:155
            attention_dropout=0.0,
        )
    if family == "llama":
        fields.update(attention_bias=cfg.bias, mlp_bias=cfg.bias)
    if family == "mistral":
        fields.update(sliding_window=cfg.window or None)
    if family == "qwen2":
        layer = "sliding_attention" if cfg.window else "full_attention"
        fields.update(
            use_sliding_window=bool(cfg.window),
            sliding_window=cfg.window or None,
            max_window_layers=0,
            layer_types=[layer] * cfg.n_layers,
        )
    return FAMILIES[family][0](**{**base, **common, **fields}, attn_implementation="sdpa")


def read_lm_config(hf: PretrainedConfig) -> LMConfig:
    """The LMConfig that describes a saved HF config; a family or setting LMConfig cannot describe is a ValueError."""
    family = hf.model_type
    if family not in FAMILIES:
        raise ValueError(f"hf-lm knows {', '.join(FAMILIES)}; this folder holds a {family!r} model")
    pad_id = hf.pad_token_id if hf.pad_token_id is not None and 0 <= hf.pad_token_id < hf.vocab_size else 0
    common = dict(vocab_size=hf.vocab_size, tie_embeddings=bool(hf.tie_word_embeddings), pad_id=pad_id)
    if family == "gpt2":
        if hf.activation_function not in GPT2_FFN:
            raise ValueError(
                f"hf-lm: GPT-2 activation_function={hf.activation_function!r} is not one of {list(GPT2_FFN)}"
            )
        if not hf.scale_attn_weights or hf.scale_attn_by_inverse_layer_idx:
            raise ValueError("hf-lm: this GPT-2 does not scale attention by 1/sqrt(d_head) alone, as LMConfig does")
        return LMConfig(
            d_model=hf.n_embd,
            n_layers=hf.n_layer,
            n_heads=hf.n_head,
            d_ff=hf.n_inner or 4 * hf.n_embd,
            max_len=hf.n_positions,
            positions="learned",
            norm_position="pre",
            ffn=GPT2_FFN[hf.activation_function],
            scale_embeddings=False,
            dropout=hf.resid_pdrop,
            **common,
        )
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    if head_dim * hf.num_attention_heads != hf.hidden_size:
        raise ValueError(f"hf-lm: head_dim={head_dim} times {hf.num_attention_heads} heads is not d_model")
    for name, wanted in (("rope_scaling", None), ("hidden_act", "silu"), ("attention_dropout", 0.0)):
        if getattr(hf, name) != wanted:
            raise ValueError(f"hf-lm: {name}={getattr(hf, name)!r} has no LMConfig field (it must be {wanted!r})")
    bias = {"llama": getattr(hf, "attention_bias", False), "mistral": False, "qwen2": True}[family]
    if family == "llama" and hf.attention_bias != hf.mlp_bias:
        raise ValueError("hf-lm: attention_bias and mlp_bias differ; LMConfig has one bias for both")
    return LMConfig(
        d_model=hf.hidden_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        n_kv_heads=0 if hf.num_key_value_heads in (None, hf.num_attention_heads) else hf.num_key_value_heads,
        d_ff=hf.intermediate_size,
        max_len=hf.max_position_embeddings,
        positions="rotary",
        rotary_layout="half",
        rotary_base=float(hf.rope_theta),
        norm="rmsnorm",
        norm_position="pre",
        ffn="swiglu",
        window=_window(hf),
        scale_embeddings=False,
        bias=bias,
        **common,
    )


def _window(hf: PretrainedConfig) -> int:
    """A saved config's sliding window as LMConfig.window (0: none); Qwen2 windowing only some layers is refused."""
    if hf.model_type == "mistral":
        return hf.sliding_window or 0
    if hf.model_type == "qwen2":
        sliding = {kind == "sliding_attention" for kind in hf.layer_types}
        if len(sliding) > 1:
            raise ValueError(
                "hf-lm: this Qwen2 slides its window on some layers only; LMConfig.window is every layer's"
            )
        return hf.sliding_window if sliding == {True} else 0
    return 0
