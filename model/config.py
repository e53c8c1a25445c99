"""The model's configuration: one frozen dataclass whose fields are the knobs of the paper's Table 3."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PE_KINDS = ("sinusoidal", "learned", "none")
INITS = ("xavier", "normal")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder, named as in the paper (Vaswani et al. 2017, Table 3)."""

    N: int = 6  # layers in the encoder and in the decoder
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8  # attention heads
    d_k: int = 64  # per-head query/key size; h * d_k need not equal d_model (Table 3 rows A, B, C)
    d_v: int = 64  # per-head value size
    P_drop: float = 0.1  # residual dropout, also on embedding + PE sums (section 5.4)
    eps_ls: float = 0.1  # label smoothing (section 5.4)
    pe: str = "sinusoidal"  # 'sinusoidal' | 'learned' (row E) | 'none'
    vocab_size: int = 37000  # shared source/target BPE vocabulary ("about 37000 tokens", section 5.1)
    max_len: int = 1024  # longest sequence the positional encoding covers
    share_embeddings: bool = True  # one matrix for source, target and pre-softmax (section 3.4)
    pad_id: int = 0
    init: str = "xavier"  # 'xavier': Xavier-uniform matrices, N(0, d_model^-0.5) embeddings | 'normal': N(0, 0.02) (model/init.py)
    init_width: int = (
        0  # 'xavier' with the stds it has at this d_model (a scaled row started as its full-size one); 0 = own
    )

    def __post_init__(self) -> None:
        for name in ("N", "d_model", "d_ff", "h", "d_k", "d_v", "vocab_size", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {name}={value!r} must be a positive integer")
        if not 0.0 <= self.P_drop < 1.0:
            raise ValueError(f"config field P_drop={self.P_drop!r} must lie in [0, 1)")
        if not 0.0 <= self.eps_ls < 1.0:
            raise ValueError(f"config field eps_ls={self.eps_ls!r} must lie in [0, 1)")
        if self.pe not in PE_KINDS:
            raise ValueError(f"config field pe={self.pe!r} must be one of {', '.join(PE_KINDS)}")
        if self.pe == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"config field d_model={self.d_model} must be even for sinusoidal PE")
        if self.init not in INITS:
            raise ValueError(f"config field init={self.init!r} must be one of {', '.join(INITS)}")
        if not isinstance(self.init_width, int) or isinstance(self.init_width, bool) or self.init_width < 0:
            raise ValueError(
                f"config field init_width={self.init_width!r} must be 0 (the model's own width) or a d_model"
            )
        if self.init_width and self.init != "xavier":
            raise ValueError(
                f"config field init_width={self.init_width} applies to init='xavier' only (init={self.init!r})"
            )
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"config field pad_id={self.pad_id} must lie in [0, vocab_size={self.vocab_size})")

    def replace(self, **changes: object) -> TransformerConfig:
        """A copy with some fields changed; unknown field names are a one-line error."""
        return replaced(self, changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def field_names(config_class: type = TransformerConfig) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(config_class))


def replaced(config, changes: dict[str, object]):
    """A copy of a config dataclass with some fields changed; unknown field names are a one-line ValueError."""
    names = field_names(type(config))
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(unknown)}; valid fields: {', '.join(names)}")
    return dataclasses.replace(config, **changes)


def parse_overrides(pairs: dict[str, str], config_class: type = TransformerConfig) -> dict[str, object]:
    """Turn 'key=value' strings into typed changes of a config dataclass ('h=4' -> {'h': 4})."""
    types = {f.name: f.type for f in dataclasses.fields(config_class)}
    changes: dict[str, object] = {}
    for key, text in pairs.items():
        if key not in types:
            raise ValueError(f"unknown config field {key!r}; valid fields: {', '.join(types)}")
        kind = types[key]
        try:
            if kind == "bool":
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                changes[key] = text.lower() in ("true", "1")
            elif kind == "int":
                changes[key] = int(text)
            elif kind == "float":
                changes[key] = float(text)
            else:
                changes[key] = text
        except ValueError:
            raise ValueError(f"config field {key}={text!r} is not a valid {kind}") from None
    return changes
