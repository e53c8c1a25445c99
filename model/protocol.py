"""The plug-in protocol: what a model must offer so that the invariants and the ablation runner can drive it.

An adapter is a torch.nn.Module (so .eval(), .train(), .double(), .parameters() work) with the methods
below. Shapes: src (B, S) and tgt (B, T) are token ids; src_pad (B, S) and tgt_pad (B, T) are bool,
True at padding. A capability the model lacks is named in `unsupported` with the reason, and the
method for it raises NotImplementedError; checks that need it then report "not applicable" (as they do when
the invariants find, by trying it, that a capability is missing although `unsupported` does not say so).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Iterator, Mapping, Protocol, runtime_checkable

from torch import Tensor
from torch.nn import Parameter

from model.attention import AttentionRecord
from model.cache import KVCache
from model.config import TransformerConfig
from model.paper_params import PaperParams

# Capabilities a model may lack, each with the checks that need it.
CAPABILITIES = {
    "kv_cache": "incremental decoding with new_cache() (cached decoding checks, fast beam search)",
    "attention_probs": "capturing attention probabilities (softmax and masking checks)",
    "positional_table": "reading the positional encoding table (PE checks)",
    "positional_switch": "switching the positional encoding off (permutation equivariance)",
    "source_embeddings": "encode taking float source embeddings instead of ids (checks that feed chosen vectors in)",
    "target_embeddings": "decode taking float target embeddings instead of ids (checks that feed chosen vectors in)",
}


# The sides a batch may pad its source on. A model that masks from lengths (keys 0 .. length-1, as many NMT toolkits
# do) supports one; it says which with a `padding_side` attribute ("right" or "left"), and the checks then pad only
# that side and judge the properties that need the other, or padding inside a row, not applicable. A model that says
# nothing is taken to honour its pad mask wherever the padding is.
PADDING_SIDES = ("right", "left")

# A model that trains on packed rows (several pairs per row, model/batch.py) says so with `takes_segments = True`
# and takes `forward(..., segments=(src_segments, tgt_segments))`, computing each pair as it would alone (the
# reference: model/transformer.py); the runner packs batches (budgets short and paper, on a GPU) for no other model.


@runtime_checkable
class Seq2SeqModel(Protocol):
    """An encoder-decoder under test. See README.md, "Plugging in your model", for a worked example."""

    config: TransformerConfig
    unsupported: Mapping[str, str]  # capability name (a key of CAPABILITIES) -> why the model lacks it

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Tensor:
        """Logits (B, T, vocab) for teacher-forced target tgt."""

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        """Encoder output, the memory (B, S, d_model). src is ids (B, S) or source embeddings already scaled by
        sqrt(d_model) (B, S, d_model, float), which enter the layers as ids' embeddings would (positions added)."""

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor, cache: KVCache | None = None
    ) -> Tensor:
        """Logits (B, T, vocab). tgt is ids (B, T) or already embedded tokens (B, T, d_model) as embed returns them
        (positions added here); with a cache, tgt holds only the new positions and the cache the earlier ones."""

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings as the model feeds them to its layers before positions are added (B, T, d_model)."""

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """The training loss (label-smoothed cross-entropy with eps_ls), averaged over non-pad target tokens."""

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding."""

    def attention_probs(self) -> AbstractContextManager[list[AttentionRecord]]:
        """While open, every attention module appends its probabilities to the yielded list."""

    def positional_table(self, positions: int) -> Tensor:
        """The positional encoding added at positions 0 .. positions-1, (positions, d_model)."""

    def positional_encoding(self, enabled: bool) -> AbstractContextManager[None]:
        """While open, positional encoding is switched on or off."""

    def embedding_weights(self) -> Mapping[str, Tensor]:
        """The matrices of the source embedding, target embedding and pre-softmax linear ('source', 'target', 'generator')."""

    def parameter_groups(self) -> Mapping[str, list[Parameter]]:
        """Trainable parameters by part: 'embeddings', 'encoder', 'decoder' (and any others the model has)."""

    # From torch.nn.Module, listed because the invariants and the runner call them.
    def parameters(self, recurse: bool = True) -> Iterator[Parameter]: ...

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]: ...

    def train(self, mode: bool = True) -> Seq2SeqModel: ...

    def eval(self) -> Seq2SeqModel: ...

    def to(self, *args, **kwargs) -> Seq2SeqModel: ...

    def state_dict(self) -> Mapping[str, Tensor]: ...

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True): ...


@runtime_checkable
class PaperLayout(Protocol):
    """Optional members, not part of Seq2SeqModel: a model that has them can be checked against the paper's equations
    holding its own weights (invariants/properties/oracle.py); one without them gets those checks "not applicable"."""

    def paper_params(self) -> PaperParams:
        """The weights in the paper's layout: embeddings (3.4), W^Q_i, W^K_i, W^V_i, W^O (3.2.2), W1, b1, W2, b2
        (eq. 2), LayerNorm gains and biases (3.1), the positional encoding (3.5); what the paper lacks in `extras`."""

    def paper_sublayers(self, src: Tensor, tgt: Tensor, src_pad: Tensor, tgt_pad: Tensor) -> Mapping[str, Tensor]:
        """Sub-layer outputs of one eval-mode forward pass, by the names of model.paper_params.sites (any subset)."""


# The protocol's members in the order written above: its annotated attributes, then its methods.
MEMBERS = (
    *Seq2SeqModel.__annotations__,
    *(name for name, value in vars(Seq2SeqModel).items() if callable(value) and not name.startswith("_")),
)


def missing_members(obj: object) -> list[str]:
    """The protocol members that obj lacks (empty when it satisfies the protocol)."""
    return [name for name in MEMBERS if not hasattr(obj, name)]
