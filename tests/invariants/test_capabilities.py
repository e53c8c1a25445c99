"""A member the adapter does not implement makes the checks that need it not applicable, naming the member and what to
add; it never makes them errors. Adapters written before `encode` had to take float embeddings are the common case."""

import math
from contextlib import contextmanager

import pytest
from hypothesis import settings

from invariants import run_suite
from invariants.engine import ERROR, NOT_APPLICABLE, PASS
from invariants.subject import Subject
from invariants.suite import PROPERTIES
from model import Transformer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"


class IdsOnlyEncoder(Transformer):
    """An adapter written before encode had to take embeddings: it looks every input up in its embedding table."""

    def encode(self, src, src_pad):
        return super().encode(self.src_embed(src) * math.sqrt(self.config.d_model), src_pad)


class CaptureNotWritten(Transformer):
    """attention_probs left as a stub that raises, and not declared in `unsupported`."""

    @contextmanager
    def attention_probs(self):
        raise NotImplementedError("attention capture is not written yet")
        yield []


def spec(model_class) -> str:
    """The class as a user's spec, at a small own config (its factory honours every config field)."""
    return f"{__name__}:{model_class.__name__},{SMALL}"


def needing(capability: str) -> set[str]:
    return {p.name for p in PROPERTIES if capability in p.needs}


def test_an_adapter_whose_encode_takes_only_ids_gets_not_applicable_naming_encode_never_an_error():
    results = run_suite(spec(IdsOnlyEncoder), settings=settings(settings.default, max_examples=2))
    verdicts = {r.name: r.verdict for r in results}
    assert ERROR not in verdicts.values(), {r.name: r.reason for r in results if r.verdict == ERROR}
    assert {name for name, v in verdicts.items() if v == NOT_APPLICABLE} == needing("source_embeddings")
    assert {"embedding_scaling", "layer_norm_outputs", "residual_dropout", "ffn_nonlinear"} <= needing(
        "source_embeddings"
    )
    assert all(v == PASS for name, v in verdicts.items() if name not in needing("source_embeddings"))
    reason = next(r.reason for r in results if r.name == "embedding_scaling")
    assert reason.startswith("source_embeddings: encode(float source embeddings) raised RuntimeError: Expected tensor")
    assert "let encode take (B, S, d_model) float source embeddings" in reason and "docs/plugging-in.md" in reason


def test_attention_capture_that_raises_without_being_declared_is_not_applicable_and_never_drawn():
    results = run_suite(spec(CaptureNotWritten), settings=settings(settings.default, max_examples=2))
    verdicts = {r.name: r.verdict for r in results}
    assert ERROR not in verdicts.values(), {r.name: r.reason for r in results if r.verdict == ERROR}
    assert {name for name, v in verdicts.items() if v == NOT_APPLICABLE} == needing("attention_probs")
    reason = next(r.reason for r in results if r.name == "causal_future_probs")
    assert reason.startswith(
        "attention_probs: attention_probs() raised NotImplementedError: attention capture is not "
        "written yet; to be checked here, a context manager yielding a list"
    )


def test_a_declared_capability_is_taken_at_its_word_and_an_undeclared_one_is_tried_once():
    subject = Subject(spec(IdsOnlyEncoder))
    subject.unsupported = {"positional_table": "declared"}
    assert subject.lacks("positional_table") == "positional_table: declared"
    model, calls = subject.model(), []
    encode = model.encode
    model.encode = lambda *args: calls.append(args) or encode(*args)
    first = subject.lacks("source_embeddings")
    assert first.startswith("source_embeddings: encode(float source embeddings) raised RuntimeError")
    assert subject.lacks("source_embeddings") == first and len(calls) == 1
    assert subject.lacks("target_embeddings") is None  # decode takes embeddings: that capability is there


def test_every_capability_a_property_needs_is_in_the_protocol_and_can_be_tried():
    from invariants.capabilities import PROBES
    from model.protocol import CAPABILITIES

    needed = {cap for p in PROPERTIES for cap in p.needs}
    assert needed <= set(CAPABILITIES) == set(PROBES)
