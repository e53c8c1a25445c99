"""The decoder-only model's configuration: one frozen dataclass, the paper's options and the modern ones as fields.

The paper's decoder (Vaswani et al. 2017, section 3.1) is post-LN with LayerNorm, sinusoidal positions added to
embeddings scaled by sqrt(d_model), a ReLU FFN and tied embeddings. The modern options, each from its paper: rotary
positions (Su et al. 2021, RoFormer), RMSNorm (Zhang and Sennrich 2019), SwiGLU (Shazeer 2020), grouped-query attention
(Ainslie et al. 2023), a sliding window (Beltagy et al. 2020; Jiang et al. 2023, Mistral) and pre-LN (Xiong et al. 2020).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from model.config import field_names as config_fields
from model.config import replaced

POSITIONS = ("sinusoidal", "learned", "rotary", "none")
# Which dimensions a rotation pairs: "interleaved" pairs (2i, 2i+1) as RoFormer writes it (eq. 14); "half" pairs
# (i, i + d/2), the GPT-NeoX layout that HuggingFace's Llama, Mistral and Qwen2 use ("rotate_half").
ROTARY_LAYOUTS = ("interleaved", "half")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("post", "pre")  # post: LayerNorm(x + Sublayer(x)), section 3.1; pre: x + Sublayer(Norm(x))
FFNS = ("relu", "gelu", "swiglu")


@dataclass(frozen=True)
class LMConfig:
    """Hyper-parameters of a decoder-only language model (the paper's names where it has one)."""

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 0  # key/value heads, each read by n_heads / n_kv_heads query heads (GQA); 0 = n_heads
    d_ff: int = 256
    max_len: int = 512  # longest sequence the positions cover
    positions: str = "sinusoidal"  # sinusoidal (section 3.5) | learned (Table 3 row E) | rotary | none
    rotary_layout: str = "interleaved"  # which dimensions a rotation pairs (ROTARY_LAYOUTS)
    rotary_base: float = 10000.0  # theta_i = base^(-2i/d_head), RoFormer eq. 15
    norm: str = "layernorm"  # layernorm (section 3.1) | rmsnorm
    norm_position: str = "post"  # post (section 3.1) | pre
    ffn: str = "relu"  # relu (eq. 2) | gelu | swiglu
    window: int = 0  # a query at sequence index i sees keys j with i - window < j <= i; 0 = every earlier key
    scale_embeddings: bool = True  # embeddings multiplied by sqrt(d_model) (section 3.4)
    tie_embeddings: bool = True  # one matrix for the embedding and the pre-softmax linear (section 3.4)
    bias: bool = True  # biases in the attention and FFN linears
    dropout: float = 0.0  # residual dropout (section 5.4)
    pad_id: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {name}={value!r} must be a positive integer")
        for name in ("n_kv_heads", "window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"config field {name}={value!r} must be a non-negative integer (0: off)")
        if self.d_model % self.n_heads:
            raise ValueError(f"config field d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"config field n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        for name, allowed in (
            ("positions", POSITIONS),
            ("rotary_layout", ROTARY_LAYOUTS),
            ("norm", NORMS),
            ("norm_position", NORM_POSITIONS),
            ("ffn", FFNS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"config field {name}={getattr(self, name)!r} must be one of {', '.join(allowed)}")
        if (
            self.positions in ("sinusoidal", "rotary")
            and (self.d_model if self.positions == "sinusoidal" else self.d_head) % 2
        ):
            raise ValueError(
                f"config field positions={self.positions!r} needs an even width (d_model, or d_head for rotary)"
            )
        if not self.rotary_base > 1:
            raise ValueError(f"config field rotary_base={self.rotary_base!r} must be above 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"config field dropout={self.dropout!r} must lie in [0, 1)")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"config field pad_id={self.pad_id} must lie in [0, vocab_size={self.vocab_size})")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads when it is 0 (multi-head attention)."""
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        """Each head's query, key and value width."""
        return self.d_model // self.n_heads

    def replace(self, **changes: object) -> LMConfig:
        """A copy with some fields changed; unknown field names are a one-line error."""
        return replaced(self, changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def field_names() -> tuple[str, ...]:
    return config_fields(LMConfig)


# Named configs: the paper's decoder at a small size, its modern counterpart, and sizes users train.
PRESETS: dict[str, LMConfig] = {
    "small": LMConfig(),
    "modern": LMConfig(
        positions="rotary",
        rotary_layout="half",
        norm="rmsnorm",
        norm_position="pre",
        ffn="swiglu",
        n_kv_heads=2,
        scale_embeddings=False,
        tie_embeddings=False,
        bias=False,
    ),
    "gpt2-small": LMConfig(
        vocab_size=50257,
        d_model=768,
        n_layers=12,
        n_heads=12,
        d_ff=3072,
        max_len=1024,
        positions="learned",
        norm_position="pre",
        ffn="gelu",
        scale_embeddings=False,
    ),
}


def lm_preset(name: str) -> LMConfig:
    """A named config (PRESETS); an unknown name is a ValueError listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown decoder-only preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
